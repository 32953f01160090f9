"""The compose test's steps against the host-network variant (scripts/compose-test.sh).

Up; every container healthy; every socket the containers listen on is on
loopback; the standby coordinator live but not ready; Prometheus scraping every
Stalwart service; a job submitted from the CLI container; a trainer that holds a
slot and then the leader coordinator crashed (kill -9 of the container's process)
while it runs; both containers restarted by their restart policy; the job
SUCCEEDED with weights bitwise equal to a one-process reference (computed in a
trainer container). The cluster's event stream is recorded throughout, and the
recovery of each crash (kill -> the next step committed) is read from it with the
demo's rules (stalwart/demo/timeline.py). Every wait is on a condition with a
generous deadline; the times are measured, never asserted.
Writes the measurements as JSON to --report; exits 1 with a reason on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import sockets

from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo import timeline
from stalwart.demo.run import wait_finished, wait_step
from stalwart.demo.watch import EventRecorder

ROOT = Path(__file__).resolve().parents[2]
JOB = "compose-test"
STATUS_SERVICE = "stalwart.v1.CoordinatorService"
COORDINATORS = ("coordinator-1", "coordinator-2")
TRAINERS = ("trainer-1", "trainer-2", "trainer-3")
STEPS_BETWEEN = 10  # steps before the first crash, between the crashes, and after the last
# No step for this long is a hung job, not a slow one: on a two-core host at load 45
# a crashed trainer's slot took minutes to be refilled by a cold standby.
STALL_S = 600.0
JOB_TIMEOUT_S = 3600.0


class Failed(Exception):
    pass


def log(msg: str) -> None:
    print(f"[drive {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, timeout: float = 600, check: bool = True, stdin: str | None = None) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and result.returncode != 0:
        raise Failed(f"{' '.join(cmd[:6])}...: exit {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def wait(what: str, cond, deadline_s: float, every_s: float = 1.0):
    """cond() until truthy (its value is returned); Failed after deadline_s."""
    end = time.monotonic() + deadline_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise Failed(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(every_s)


class Stack:
    def __init__(self, work: Path, project: str) -> None:
        self.file = work / "hostnet" / "docker-compose.yml"
        self.project = project
        self.ports = json.loads((work / "hostnet" / "ports.json").read_text())
        self.coordinators = ",".join(f"127.0.0.1:{self.ports[n]['50051']}" for n in COORDINATORS)

    def compose(self, *args: str, timeout: float = 900, **kw) -> str:
        return sh("docker-compose", "-p", self.project, "-f", str(self.file), *args,
                  timeout=timeout, **kw)  # fmt: skip

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service).strip()
        if not cid:
            raise Failed(f"no container for {service}")
        return cid

    def inspect(self, cid: str, template: str) -> str:
        return sh("docker", "inspect", "-f", template, cid).strip()

    def health(self) -> dict[str, str]:
        out = {}
        for cid in self.compose("ps", "-q").split():
            name, status = self.inspect(
                cid, "{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}"
            ).split()
            out[name.lstrip("/")] = status
        return out

    def crash(self, service: str) -> str:
        """kill -9 of the container's main process, from the host: a crash.

        Not `docker kill`: the engine marks a container it was told to kill as
        stopped on purpose, and its restart policy then leaves it down."""
        cid = self.container(service)
        os.kill(int(self.inspect(cid, "{{.State.Pid}}")), signal.SIGKILL)
        return cid

    def prometheus(self, path: str) -> dict:
        url = f"http://127.0.0.1:{self.ports['prometheus']['9090']}{path}"
        return json.loads(urllib.request.urlopen(url, timeout=5).read())


# ------------------------------------------------------------------ before the job


def bring_up(stack: Stack, report: dict) -> None:
    t0 = time.monotonic()
    log("compose up -d (waits for each depends_on healthcheck)")
    for attempt in (1, 2, 3):
        try:
            stack.compose("up", "-d", timeout=1800)
            break
        except Failed as err:
            # Compose v1 gives up on a dependency that is not yet healthy; `up` again
            # goes on from where it stopped. Still failing: the health wait says why.
            log(f"compose up, attempt {attempt}: {str(err)[-300:]}")
            report.setdefault("up_retries", []).append(str(err)[-300:])

    def all_healthy():
        h = stack.health()
        bad = {n: s for n, s in h.items() if s != "healthy"}
        return h if h and not bad else None

    health = wait("every container healthy", all_healthy, 1500, 2)
    report["healthy_after_up_s"] = round(time.monotonic() - t0, 1)
    report["containers"] = sorted(health)
    log(f"{len(health)} containers healthy after {report['healthy_after_up_s']} s")


def check_loopback(stack: Stack, report: dict) -> None:
    """Every socket a container listens on is on 127.0.0.0/8 (they share the host's network)."""
    ids = stack.compose("ps", "-q").split()

    def cgroup(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return ""

    found = sockets.stack_listeners(sockets.parse_ss(sh("ss", "-H", "-ltunp")), ids, cgroup)
    report["listening"] = sorted(f"{s.proto} {s.address}:{s.port}" for s, _ in found)
    wide = [
        f"{s.proto} {s.address}:{s.port}" for s, _ in found if not sockets.is_loopback(s.address)
    ]
    if not found or wide:
        raise Failed(f"containers listen beyond loopback: {wide or 'no socket found at all'}")
    log(f"{len(found)} listening sockets of the containers, all on loopback")


def check_readiness(stack: Stack, leader: str, report: dict) -> None:
    """The leader is ready for its service name, the standby only live."""
    standby = next(n for n in COORDINATORS if n != leader)
    probe = ["python", "-m", "stalwart.healthcheck"]

    def run(service: str, *extra: str) -> str:
        return sh("docker", "exec", stack.container(service), *probe, *extra, check=False).strip()

    ready = run(leader, "--service", STATUS_SERVICE)
    live, not_ready = run(standby), run(standby, "--service", STATUS_SERVICE)
    report["readiness"] = {"leader": ready, "standby_live": live, "standby_ready": not_ready}
    if (ready, live, not_ready) != ("SERVING", "SERVING", "NOT_SERVING"):
        raise Failed(f"live/ready probes: {report['readiness']}")


def check_prometheus(stack: Stack, report: dict) -> None:
    wanted = {n for n, p in stack.ports.items() if "9100" in p}

    def scraped():
        targets = stack.prometheus("/api/v1/targets")["data"]["activeTargets"]
        up = {t["labels"].get("service") for t in targets if t["health"] == "up"}
        return up if wanted <= up else None

    up = wait(f"Prometheus scraping {len(wanted)} services", scraped, 300, 2)
    report["prometheus_targets_up"] = sorted(up)


def submit(stack: Stack, steps: int) -> None:
    log(f"submitting job {JOB} from the CLI container ({steps} steps)")
    out = stack.compose("run", "--rm", "-T", "cli", "stalwart", "job", "submit",
                        "--model", "mlp", "--slots", "3", "--steps", str(steps), "--seed", "7",
                        "--job-id", JOB, "-o", "json", timeout=600)  # fmt: skip
    log(f"submitted: {out.strip()[:200]}")


# ------------------------------------------------------------------------ the job


async def leader_of(client: CoordinatorClient) -> str:
    end = time.monotonic() + 300
    while time.monotonic() < end:
        status = await client.cluster_status()
        if status.leader_id in COORDINATORS:
            return status.leader_id
        await asyncio.sleep(1)
    raise Failed("no coordinator leads after 300 s")


async def progress(
    recorder: EventRecorder, watcher: asyncio.Task, step: int, what: str, may_end: bool = False
) -> None:
    """Until the job committed ``step`` steps; Failed if it stalled, the event stream
    broke, or (unless ``may_end``) the job ended first."""
    waiting = asyncio.create_task(wait_step(recorder, step, STALL_S))
    await asyncio.wait({waiting, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        raise Failed(f"the event stream ended before {what}: {watcher.exception()!r}")
    try:
        waiting.result()
    except TimeoutError as err:
        raise Failed(f"before {what}: {err}") from None
    if recorder.step < step and not may_end:
        raise Failed(f"the job ended at step {recorder.step} before {what}: raise --steps")


async def trainer_victim(client: CoordinatorClient) -> str:
    for _ in range(300):  # a slot may be between holders for a moment
        held = {s.node_id for s in (await client.get_job(JOB)).slots} & set(TRAINERS)
        if held:
            return sorted(held)[0]
        await asyncio.sleep(0.2)
    raise Failed(f"no trainer of {TRAINERS} holds a slot of {JOB}")


async def crash(
    stack: Stack, client: CoordinatorClient, kind: str, recorder: EventRecorder
) -> tuple[timeline.Fault, str]:
    name = await (trainer_victim(client) if kind == "trainer" else leader_of(client))
    fault = timeline.Fault(kind, name, time.time(), recorder.step)
    cid = await asyncio.to_thread(stack.crash, name)
    log(f"kill -9 {kind} {name} at step {fault.step_at_kill}")
    return fault, cid


async def run_job(stack: Stack, client: CoordinatorClient, steps: int, report: dict) -> list:
    """Submit, crash a trainer and the leader, wait for the end; the faults and events."""
    recorder = EventRecorder(client, JOB)
    watcher = asyncio.create_task(recorder.run())
    crashed: list[tuple[timeline.Fault, str]] = []
    try:
        await asyncio.to_thread(submit, stack, steps)
        submitted = time.time()
        for kind in ("trainer", "coordinator"):
            await progress(recorder, watcher, recorder.step + STEPS_BETWEEN, f"the {kind} kill")
            crashed.append(await crash(stack, client, kind, recorder))
        # The job may end before this: trainers go on without a leader, and the events
        # that say how far they got lag behind (stamped by the leader's poll). Only a
        # new leader can mark the job SUCCEEDED, which wait_finished then sees.
        await progress(recorder, watcher, recorder.step + STEPS_BETWEEN, "the end of the kills",
                       may_end=True)  # fmt: skip
        job = await wait_finished(client, JOB, JOB_TIMEOUT_S, STALL_S, lambda _: None)
        await recorder.wait_step(job.step, 30.0)  # the last STEP_COMMITTED events
    except TimeoutError as err:
        raise Failed(str(err)) from None
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    report["job_s"] = round(time.time() - submitted, 1)
    faults = [f for f, _ in crashed]
    recoveries = [timeline.recover(f, recorder.events).to_dict(submitted) for f in faults]
    report["trainer_kill"], report["leader_kill"] = recoveries
    report["step_audit"] = timeline.audit_steps(recorder.events, JOB, steps).to_dict()
    for rec, (_, cid) in zip(recoveries, crashed, strict=True):
        rec["container_restarts"] = await asyncio.to_thread(restarted, stack, cid)
    return [job]


def restarted(stack: Stack, cid: str) -> int:
    """The container's restart count once its restart policy brought it back."""

    def back():
        count, running = stack.inspect(cid, "{{.RestartCount}} {{.State.Running}}").split()
        return int(count) if int(count) >= 1 and running == "true" else None

    return wait(f"container {cid[:12]} restarted", back, 600, 2)


def verify(stack: Stack, job: coordinator.Job, report: dict) -> None:
    report["job_state"] = coordinator.JobState.Name(job.state).removeprefix("JOB_STATE_")
    if report["job_state"] != "SUCCEEDED":
        raise Failed(f"job ended {report['job_state']}: {job.reason}")
    script = (ROOT / "scripts" / "compose" / "verify.py").read_text()
    # Labelled with the project, so the teardown removes it if the run is interrupted.
    out = sh("docker", "run", "--rm", "-i", "--network", "host", "--entrypoint", "python",
             "--label", f"com.docker.compose.project={stack.project}",
             "stalwart/trainer:dev", "-", stack.coordinators, JOB, stdin=script, timeout=1200)  # fmt: skip
    report["verify"] = json.loads(out.strip().splitlines()[-1])
    if not report["verify"]["bitwise_equal"]:
        raise Failed(f"weights differ from the reference run: {report['verify']}")
    query = "/api/v1/query?query=sum%20by%20(kind)%20(stalwart_coordinator_recoveries_total)"
    report["recoveries_total"] = {
        r["metric"].get("kind", ""): float(r["value"][1])
        for r in stack.prometheus(query)["data"]["result"]
    }


async def exercise(stack: Stack, steps: int, report: dict) -> None:
    await asyncio.to_thread(bring_up, stack, report)
    await asyncio.to_thread(check_loopback, stack, report)
    async with CoordinatorClient(stack.coordinators, call_timeout_s=30.0,
                                 retry_for_s=300.0) as client:  # fmt: skip
        leader = await leader_of(client)
        await asyncio.to_thread(check_readiness, stack, leader, report)
        await asyncio.to_thread(check_prometheus, stack, report)
        (job,) = await run_job(stack, client, steps, report)
    await asyncio.to_thread(verify, stack, job, report)


def summary(report: dict) -> str:
    parts = []
    for key, what in (("trainer_kill", "trainer"), ("leader_kill", "leader")):
        rec = report.get(key) or {}
        parts.append(f"{what} {rec.get('target')} kill -> next step {rec.get('recovery_s')} s "
                     f"(detected {rec.get('detection_s')} s)")  # fmt: skip
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    stack, report = Stack(args.work, args.project), {"steps": args.steps}
    t0 = time.monotonic()
    try:
        asyncio.run(exercise(stack, args.steps, report))
    except Exception as err:  # noqa: BLE001 - every failure is reported the same way
        report["error"] = str(err) if isinstance(err, Failed) else repr(err)
        log(f"FAILED: {report['error']}")
        return 1
    finally:
        report["total_s"] = round(time.monotonic() - t0, 1)
        args.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(json.dumps(report, indent=2, default=str))
    log(f"recovery: {summary(report)}")
    log("compose-test: passed (job SUCCEEDED after a trainer and a leader crash, bitwise equal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
