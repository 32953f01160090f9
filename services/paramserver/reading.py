"""Reading a chunked request stream: its header first, then its tensors' chunks.

Shared by the client-facing calls (RegisterModel, Push) and the backup side
(ReplicatePush, InstallState)."""

from __future__ import annotations

import asyncio

from stalwart import codec
from stalwart.errors import ErrorKind, StalwartError

# How long an incomplete request stream waits for gRPC's own cancellation before it
# is judged truncated (a refused oversize message looks like a half-close first).
STREAM_END_GRACE_S = 2.0


async def stream_ended(complete: bool = True) -> None:
    """Call at the end of a request stream, before judging it incomplete.

    A message over the server's size limit ends the stream for the handler as
    if the client had half-closed, while gRPC itself answers RESOURCE_EXHAUSTED
    and cancels the handler. Waiting lets that cancellation land here, so the
    call is not also refused, logged and counted as a truncated stream. One
    yield was enough on an idle machine, not on a loaded one: an incomplete
    stream (bad input, rare) waits up to ``STREAM_END_GRACE_S`` for it.
    """
    await asyncio.sleep(0)
    deadline = asyncio.get_running_loop().time() + (0 if complete else STREAM_END_GRACE_S)
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


async def header(request_iterator, field_name: str):
    """The stream's first message, which must be its header; returns the header."""
    try:
        first = await anext(aiter(request_iterator))
    except StopAsyncIteration:
        await stream_ended(complete=False)
        raise StalwartError(ErrorKind.TRUNCATED_STREAM, "empty stream: no header") from None
    if isinstance(first, codec.WireChunk) or first.WhichOneof("part") != "header":
        raise StalwartError(ErrorKind.BAD_STREAM, f"the first message must be the {field_name}")
    return first.header


async def tensors(
    request_iterator, specs, limits, on_chunk=None, packed: bool = False,
    until_complete: bool = False,
) -> codec.ChunkAssembler:  # fmt: skip
    """Assemble the chunks; ``on_chunk(chunk, placed)`` sees each one once it checked
    out, ``placed`` being its bytes (see ``ChunkAssembler.add``). ``until_complete``:
    stop reading once every byte arrived, for a stream that goes on with other
    requests (PushStream); else read to the stream's end."""
    assembler = codec.ChunkAssembler(specs, limits, packed)
    if until_complete and assembler.complete:
        return assembler
    async for message in request_iterator:
        chunk = codec.chunk_of(message)
        if chunk is None:
            raise StalwartError(ErrorKind.BAD_STREAM, "only chunks may follow the header")
        placed = assembler.add(chunk)
        if on_chunk is not None:
            await on_chunk(chunk, placed)
        if until_complete and assembler.complete:
            return assembler
    await stream_ended(assembler.complete)
    return assembler
