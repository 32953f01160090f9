"""A bare gRPC server for baselines: raw bytes in, raw bytes out, no protobuf,
no interceptors. Run as ``python -m stalwart.bench.echo --port 0 --ready-file F``.

``/bench.Echo/Upload`` takes bytes and answers an empty message;
``/bench.Echo/Download`` takes a decimal byte count and answers that many bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import grpc

UPLOAD = "/bench.Echo/Upload"
DOWNLOAD = "/bench.Echo/Download"


def _identity(data: bytes) -> bytes:
    return data


async def _upload(request: bytes, context) -> bytes:
    return b""


async def _download(request: bytes, context) -> bytes:
    return bytes(int(request.decode()))


async def serve(port: int, ready_file: Path | None, max_message_bytes: int) -> None:
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    server = grpc.aio.server(options=options)
    handlers = {
        "Upload": grpc.unary_unary_rpc_method_handler(_upload, _identity, _identity),
        "Download": grpc.unary_unary_rpc_method_handler(_download, _identity, _identity),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Echo", handlers)])
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"address": f"127.0.0.1:{bound}", "pid": os.getpid(), "metrics_port": -1})
        )
        tmp.replace(ready_file)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--max-message-bytes", type=int, default=8 * 1024 * 1024)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.ready_file, args.max_message_bytes))


if __name__ == "__main__":
    main()
