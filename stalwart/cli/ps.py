"""``stalwart ps``: look at and steer paramserver replicas."""

from __future__ import annotations

import asyncio

import typer

from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.cli.output import OUTPUT_OPTION, Output, cli_errors, emit, emit_table
from stalwart.cli.target import check_address
from stalwart.errors import RpcError

app = typer.Typer(
    help="Parameter-server replicas: status, fingerprints, promotion.", no_args_is_help=True
)

ADDRESS = typer.Option(..., "--address", "-a", help="host:port of the replica")
TIMEOUT_S = 10.0


def _call(address: str, method: str, request):
    check_address(address, "--address")

    async def go():
        channel = open_channel(address)
        try:
            rpc = getattr(paramserver_grpc.ParamServerServiceStub(channel), method)
            return await rpc(request, timeout=TIMEOUT_S)
        except Exception as exc:
            if hasattr(exc, "code"):
                raise RpcError.from_grpc(exc) from None
            raise
        finally:
            await channel.close()

    return asyncio.run(go())


def _role(value: int) -> str:
    return common.ReplicaRole.Name(value).removeprefix("REPLICA_ROLE_").lower()


@app.command()
@cli_errors
def status(address: str = ADDRESS, output: Output = OUTPUT_OPTION) -> None:
    """Role, epoch, jobs and backups of one replica."""
    resp = _call(address, "GetReplicaStatus", paramserver.GetReplicaStatusRequest())
    emit(output, resp, lambda: _replica_tables(resp))


def _replica_tables(resp: paramserver.GetReplicaStatusResponse) -> None:
    emit_table(
        f"replica {resp.node_id} — {_role(resp.role)}, epoch {resp.epoch}, shard {resp.shard}",
        ["job", "version", "slots", "state MiB"],
        [(j.job_id, j.version, j.num_slots, f"{j.state_bytes / 2**20:.1f}") for j in resp.jobs],
    )
    if resp.backups:
        emit_table(
            "backups",
            ["address", "in sync", "last error"],
            [(b.address, "yes" if b.in_sync else "no", b.last_error) for b in resp.backups],
        )


@app.command()
@cli_errors
def promote(
    address: str = ADDRESS,
    epoch: int = typer.Option(..., min=1, help="new epoch, higher than every replica's"),
    backups: list[str] = typer.Option([], "--backup", "-b", help="backup host:port (repeat)"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Make a backup the primary under a higher epoch; the old primary is fenced.

    The backups are configured at the new epoch first (replicas take an epoch only
    from such configuration calls, never from the traffic they serve). A coordinator
    leader follows only a replica that holds every job with committed steps on the
    group; over one that lacks a job it promotes its own primary again, higher."""
    for backup in backups:
        _call(backup, "ConfigureReplica", paramserver.ConfigureReplicaRequest(
            role=common.REPLICA_ROLE_BACKUP, epoch=epoch))  # fmt: skip
    resp = _call(address, "Promote", paramserver.PromoteRequest(epoch=epoch, backups=backups))
    title = f"promoted {address} to primary at epoch {resp.epoch}"
    jobs = [(j.job_id, j.version) for j in resp.jobs]
    emit(output, resp, lambda: emit_table(title, ["job", "version"], jobs))


@app.command()
@cli_errors
def fingerprint(
    address: str = ADDRESS,
    job: str = typer.Option(..., "--job", "-j", help="job id"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """CRC32C fingerprints of a job's parameters and optimizer state on one replica."""
    resp = _call(address, "GetFingerprint", paramserver.GetFingerprintRequest(job_id=job))
    title = f"job {job} at version {resp.version}, epoch {resp.epoch}: combined {resp.combined:08x}"
    tensors = [(t.name, t.kind, f"{t.crc32c:08x}") for t in resp.tensors]
    emit(output, resp, lambda: emit_table(title, ["tensor", "kind", "crc32c"], tensors))
