"""The compose test's steps against the host-network variant (scripts/compose-test.sh).

Up; every container healthy; the standby coordinator live but not ready;
Prometheus scraping every Stalwart service; a job submitted from the CLI
container; a trainer container and then the leader coordinator's container
killed while it runs; the job SUCCEEDED with weights bitwise equal to a
one-process reference (computed in a trainer container). Every wait is on a
condition with a generous deadline; the times are measured, never asserted.
Writes the measurements as JSON to --report; exits 1 with a reason on failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = "compose-test"
STATUS_SERVICE = "stalwart.v1.CoordinatorService"


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
        self.coordinators = ",".join(
            f"127.0.0.1:{p['50051']}"
            for n, p in sorted(self.ports.items())
            if n.startswith("coordinator")
        )

    def compose(self, *args: str, timeout: float = 900, **kw) -> str:
        return sh("docker-compose", "-p", self.project, "-f", str(self.file), *args,
                  timeout=timeout, **kw)  # fmt: skip

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service).strip()
        if not cid:
            raise Failed(f"no container for {service}")
        return cid

    def health(self) -> dict[str, str]:
        out = {}
        for cid in self.compose("ps", "-q").split():
            name, status = sh("docker", "inspect", "-f",
                              "{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}",
                              cid).split()  # fmt: skip
            out[name.lstrip("/")] = status
        return out

    def stalwart(self, *args: str) -> dict:
        """The host's CLI (same checkout) against the coordinators, JSON out."""
        cmd = [str(ROOT / ".venv/bin/stalwart"), *args, "-c", self.coordinators, "-o", "json",
               "--timeout", "60"]  # fmt: skip
        return json.loads(sh(*cmd, timeout=180))

    def job(self) -> dict:
        """The job, or {} while no leader answers in time (a loaded host, a failover)."""
        try:
            return self.stalwart("job", "get", JOB)
        except Failed as err:
            log(f"no answer about the job yet: {str(err)[-200:]}")
            return {}

    def metric(self, service: str, name: str) -> float | None:
        url = f"http://127.0.0.1:{self.ports[service]['9100']}/metrics"
        try:
            text = urllib.request.urlopen(url, timeout=3).read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def prometheus(self, path: str) -> dict:
        url = f"http://127.0.0.1:{self.ports['prometheus']['9090']}{path}"
        return json.loads(urllib.request.urlopen(url, timeout=5).read())


def state(job: dict) -> str:
    return str(job.get("state", "")).removeprefix("JOB_STATE_")


def step(job: dict) -> int:
    return int(job.get("step", 0) or 0)


def bring_up(stack: Stack, report: dict) -> None:
    t0 = time.monotonic()
    log("compose up -d (waits for each depends_on healthcheck)")
    for attempt in (1, 2, 3):
        try:
            stack.compose("up", "-d", timeout=1200)
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

    health = wait("every container healthy", all_healthy, 600, 2)
    report["healthy_after_up_s"] = round(time.monotonic() - t0, 1)
    report["containers"] = sorted(health)
    log(f"{len(health)} containers healthy after {report['healthy_after_up_s']} s")


def check_readiness(stack: Stack, report: dict) -> str:
    """The leader is ready for its service name, the standby only live."""
    leader = wait("a leader", lambda: stack.stalwart("status").get("leader_id"), 120)
    standby = next(n for n in ("coordinator-1", "coordinator-2") if n != leader)
    probe = ["python", "-m", "stalwart.healthcheck"]
    ready = sh("docker", "exec", stack.container(leader), *probe, "--service", STATUS_SERVICE,
               check=False).strip()  # fmt: skip
    live = sh("docker", "exec", stack.container(standby), *probe, check=False).strip()
    not_ready = sh("docker", "exec", stack.container(standby), *probe, "--service",
                   STATUS_SERVICE, check=False).strip()  # fmt: skip
    report["readiness"] = {"leader": ready, "standby_live": live, "standby_ready": not_ready}
    if (ready, live, not_ready) != ("SERVING", "SERVING", "NOT_SERVING"):
        raise Failed(f"live/ready probes: {report['readiness']}")
    return leader


def check_prometheus(stack: Stack, report: dict) -> None:
    wanted = {n for n, p in stack.ports.items() if "9100" in p}

    def scraped():
        targets = stack.prometheus("/api/v1/targets")["data"]["activeTargets"]
        up = {t["labels"].get("service") for t in targets if t["health"] == "up"}
        return up if wanted <= up else None

    up = wait(f"Prometheus scraping {len(wanted)} services", scraped, 180, 2)
    report["prometheus_targets_up"] = sorted(up)


def submit(stack: Stack, steps: int) -> None:
    log(f"submitting job {JOB} from the CLI container ({steps} steps)")
    out = stack.compose("run", "--rm", "-T", "cli", "stalwart", "job", "submit",
                        "--model", "mlp", "--slots", "3", "--steps", str(steps), "--seed", "7",
                        "--job-id", JOB, "-o", "json", timeout=300)  # fmt: skip
    log(f"submitted: {out.strip()[:200]}")


def running_at(stack: Stack, min_step: int, what: str) -> dict:
    def ok():
        job = stack.job()
        if not job:
            return None
        if state(job) in ("SUCCEEDED", "FAILED", "CANCELLED"):
            raise Failed(f"job {state(job)} at step {step(job)} before {what}: raise --steps")
        return job if step(job) >= min_step else None

    return wait(f"step {min_step} ({what})", ok, 900, 0.5)


def kill_trainer(stack: Stack, report: dict) -> None:
    job = running_at(stack, 10, "the trainer kill")
    cid = stack.container("trainer-1")
    at = step(job)
    t0 = time.monotonic()
    sh("docker", "kill", "-s", "KILL", cid)
    log(f"killed trainer-1 at step {at}")
    running_at(stack, at + 10, "progress after the trainer kill")
    report["trainer_kill"] = {"at_step": at, "ten_more_steps_s": round(time.monotonic() - t0, 1)}
    restarts = wait("trainer-1 restarted", lambda: int(sh(
        "docker", "inspect", "-f", "{{.RestartCount}}", cid).strip() or 0), 300, 2)  # fmt: skip
    report["trainer_kill"]["container_restarts"] = restarts


def kill_leader(stack: Stack, leader: str, report: dict) -> None:
    job = running_at(stack, step(stack.job()) + 10, "the leader kill")
    other = next(n for n in ("coordinator-1", "coordinator-2") if n != leader)
    at = step(job)
    t0 = time.monotonic()
    sh("docker", "kill", "-s", "KILL", stack.container(leader))
    log(f"killed the leader {leader} at step {at}")
    wait(f"{other} leads", lambda: stack.metric(other, "stalwart_coordinator_is_leader") == 1,
         120, 0.1)  # fmt: skip
    takeover = round(time.monotonic() - t0, 2)
    running_at(stack, at + 10, "progress after the leader kill")
    report["leader_kill"] = {"leader": leader, "at_step": at, "takeover_s": takeover,
                             "ten_more_steps_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    log(f"{other} took over in {takeover} s")


def finish(stack: Stack, report: dict) -> None:
    def ended():
        job = stack.job()
        return job if state(job) in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    job = wait("the job to end", ended, 1800, 2)
    report["job_state"] = state(job)
    if state(job) != "SUCCEEDED":
        raise Failed(f"job ended {state(job)}: {job.get('reason')}")
    script = (ROOT / "scripts" / "compose" / "verify.py").read_text()
    out = sh("docker", "run", "--rm", "-i", "--network", "host", "--entrypoint", "python",
             "stalwart/trainer:dev", "-", stack.coordinators, JOB, stdin=script, timeout=900)  # fmt: skip
    report["verify"] = json.loads(out.strip().splitlines()[-1])
    if not report["verify"]["bitwise_equal"]:
        raise Failed(f"weights differ from the reference run: {report['verify']}")
    query = "/api/v1/query?query=sum%20by%20(kind)%20(stalwart_coordinator_recoveries_total)"
    report["recoveries"] = {
        r["metric"].get("kind", ""): float(r["value"][1])
        for r in stack.prometheus(query)["data"]["result"]
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    stack, report = Stack(args.work, args.project), {"steps": args.steps}
    t0 = time.monotonic()
    try:
        bring_up(stack, report)
        leader = check_readiness(stack, report)
        check_prometheus(stack, report)
        submit(stack, args.steps)
        kill_trainer(stack, report)
        kill_leader(stack, leader, report)
        finish(stack, report)
    except Failed as err:
        report["error"] = str(err)
        log(f"FAILED: {err}")
        return 1
    finally:
        report["total_s"] = round(time.monotonic() - t0, 1)
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
    log(
        "compose-test: passed (job SUCCEEDED after a trainer kill and a leader kill, bitwise equal)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
