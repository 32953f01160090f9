"""Evaluation and metrics against a local cluster of real processes.

A job with eval_every and dropout in its model: `job metrics --follow` streams one
loss per (step, slot), equal to the loss reference_run's arithmetic gives for that
slot at that step, and evaluations at versions 5, 10 and the final 12, equal to the
task's evaluate() on reference_run's weights at those versions; the final weights
stay bitwise equal to reference_run (evaluation changes nothing). The same rows come
back as a table, as TensorBoard scalars, in `stalwart top` and in the primary's
Prometheus series; through a kill -9 of the paramserver primary the promoted backup
still holds every row. Bad input gets a clean error and records nothing.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from stalwart import models, training
from stalwart.api import coordinator, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.jobmetrics import JobMetricsReader
from tests.integration.cluster.support import assert_bitwise_equal, reference, run_job
from tests.integration.cluster.test_cli import EXIT_INVALID_INPUT, one_error_line, stalwart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = "tests.unit.training.dropout_task:make"


def states(spec: coordinator.JobSpec) -> list[dict]:
    """reference_run's parameters after 0, 1, ..., spec.steps steps."""
    training.make_deterministic(1)
    return [training.reference_run(spec, steps=v) for v in range(spec.steps + 1)]


def expected_losses(spec: coordinator.JobSpec, at: list[dict]) -> dict[tuple[int, int], float]:
    """(step, slot) -> the loss compute_step reports from the weights at that version."""
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    out = {}
    for step in range(spec.steps):
        training.load_params(model, at[step])
        for slot in range(spec.num_slots):
            out[(step, slot)] = training.compute_step(task, model, slot, step, spec).loss
    return out


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("stalwart_job_")
    }


def test_follow_table_tensorboard_top_and_prometheus(local, tmp_path):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    done = stalwart("job", "submit", "--model", MODEL, "--slots", "2", "--batch-size", "8",
                    "--steps", "12", "--eval-every", "5", "-o", "json", *target)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    job_id, spec = job["job_id"], json_format.ParseDict(job["spec"], coordinator.JobSpec())
    assert spec.eval_every == 5

    board = tmp_path / "tb"
    followed = stalwart("job", "metrics", job_id, "--follow", "-o", "json", "--interval", "0.3",
                        "--tensorboard", str(board), *target, timeout=400)  # fmt: skip
    assert followed.returncode == 0, followed.stderr
    rows = [json.loads(line) for line in followed.stdout.splitlines()]
    status = stalwart("job", "status", job_id, "-o", "json", *target)
    assert json.loads(status.stdout)["state"] == "JOB_STATE_SUCCEEDED"  # followed to the end

    at = states(spec)
    losses = [r for r in rows if r["kind"] == "loss"]
    got = {(r["step"], r["slot"]): r["loss"] for r in losses}
    assert len(losses) == len(got) == spec.steps * spec.num_slots  # each (step, slot) once
    assert got == expected_losses(spec, at)
    evals = {r["version"]: r["metrics"] for r in rows if r["kind"] == "eval"}
    assert sorted(evals) == [5, 10, 12]
    for version, metrics in evals.items():
        assert metrics == training.evaluate(spec, at[version]), version

    # evaluation consumed none of the training's random numbers: dropout masks held
    async def weights():
        from stalwart.demo.watch import param_client, pull_weights

        async with CoordinatorClient(local.coordinator_addresses) as client:
            ps = await param_client(client, job_id, spec)
            try:
                return (await pull_weights(ps, job_id, spec.steps))[1]
            finally:
                await ps.close()

    assert_bitwise_equal(asyncio.run(weights()), at[spec.steps])

    again = stalwart("job", "metrics", job_id, "-o", "json", *target)
    assert again.returncode == 0, again.stderr
    assert [{k: v for k, v in r.items() if k != "time"} for r in json.loads(again.stdout)] == [
        {k: v for k, v in r.items() if k != "time"} for r in rows
    ]
    table = stalwart("job", "metrics", job_id, *target)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert sum(1 for line in lines if "│ loss" in line) == spec.steps
    assert sum(1 for line in lines if "│ eval" in line) == 3

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(board))
    events.Reload()
    mean = {s: (got[(s, 0)] + got[(s, 1)]) / 2 for s in range(spec.steps)}
    scalars = {e.step: e.value for e in events.Scalars("train/loss")}
    assert scalars == pytest.approx(mean, rel=1e-6)  # stored as float32
    assert [e.step for e in events.Scalars("eval/accuracy")] == [5, 10, 12]

    top = stalwart("top", "--once", "-o", "json", *target)
    assert top.returncode == 0, top.stderr
    summary = json.loads(top.stdout)["metrics"][job_id]
    assert int(summary["latest_step"]) == spec.steps - 1
    assert summary["latest_loss"] == pytest.approx(mean[spec.steps - 1])
    assert int(summary["last_evaluation"]["version"]) == 12

    # per-job series on the primary only, with the history's values
    exported = [
        scrape(local.procs[m.name].metrics_port)
        for m in local.of_role("paramserver")
        if local.alive(m.name)
    ]
    with_job = [s for s in exported if ("stalwart_job_train_loss", (("job", job_id),)) in s]
    assert len(with_job) == 1, "exactly one replica (the primary) exports the job's series"
    series = with_job[0]
    assert series[("stalwart_job_train_loss", (("job", job_id),))] == pytest.approx(
        mean[spec.steps - 1]
    )
    assert series[("stalwart_job_eval_version", (("job", job_id),))] == 12
    key = ("stalwart_job_eval_value", (("job", job_id), ("metric", "accuracy")))
    assert series[key] == evals[12]["accuracy"]


def test_history_survives_a_primary_kill(local):
    spec = models.default_spec(MODEL, num_slots=2, steps=24, batch_size=8, seed=5, eval_every=6)
    out = asyncio.run(run_job(local, spec, kill="paramserver", at_step=9))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert_bitwise_equal(out.weights, reference(out.job.spec))  # the stored, filled-in spec

    async def read():
        async with (
            CoordinatorClient(local.coordinator_addresses) as client,
            JobMetricsReader(client, out.job.job_id) as reader,
        ):
            records: list = []
            for _ in range(200):  # the final evaluation follows the last push
                records += await reader.new_records()
                if reader.summary.last_evaluation.version == spec.steps:
                    break
                await asyncio.sleep(0.3)
            return records

    records = asyncio.run(read())
    keys = {(r.loss.step, r.loss.slot) for r in records if r.HasField("loss")}
    assert keys == {(s, k) for s in range(spec.steps) for k in range(2)}
    versions = sorted(r.evaluation.version for r in records if r.HasField("evaluation"))
    assert versions == [6, 12, 18, 24]


def test_bad_input_is_refused_and_records_nothing(local):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    bad = stalwart("job", "submit", "--model", "mlp", "--eval-every", "-3", *target)
    assert bad.returncode == EXIT_INVALID_INPUT
    assert "eval_every must be >= 0" in one_error_line(bad)
    unknown = stalwart("job", "metrics", "no-such-job", *target)
    assert unknown.returncode == EXIT_INVALID_INPUT
    assert "no-such-job" in one_error_line(unknown)

    async def calls():
        async with CoordinatorClient(local.coordinator_addresses) as client:
            job = await client.create_job(models.default_spec("mlp", steps=3))
            shard_map = await client.get_shard_map(job.job_id)
            for _ in range(300):  # a trainer registers the model
                job = await client.get_job(job.job_id)
                if job.step >= 3:
                    break
                await asyncio.sleep(0.2)
        group = shard_map.groups[0]
        async with open_channel(group.primary_address) as channel:
            stub = paramserver_grpc.ParamServerServiceStub(channel)
            status = await stub.GetReplicaStatus(paramserver.GetReplicaStatusRequest(), timeout=10)

            async def refused(request, method="RecordEvaluation"):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await getattr(stub, method)(request, timeout=10)
                return err.value.code(), err.value.details()

            def evaluation(version, **metrics):
                return paramserver.RecordEvaluationRequest(
                    job_id=job.job_id, epoch=status.epoch,
                    evaluation=paramserver.Evaluation(version=version, metrics=metrics),
                )  # fmt: skip

            before = await stub.ListJobMetrics(
                paramserver.ListJobMetricsRequest(job_id=job.job_id), timeout=10
            )
            answers = [
                await refused(evaluation(1, loss=float("nan"))),
                await refused(evaluation(-1, loss=0.5)),
                await refused(evaluation(1)),
                await refused(
                    paramserver.RecordEvaluationRequest(
                        job_id=job.job_id,
                        epoch=status.epoch,
                        from_primary=True,
                        evaluation=paramserver.Evaluation(version=1, metrics={"loss": 0.5}),
                    )
                ),  # a primary follows no one
                await refused(
                    paramserver.ListJobMetricsRequest(job_id=job.job_id, page_token="x"),
                    "ListJobMetrics",
                ),
                await refused(
                    paramserver.ListJobMetricsRequest(job_id="no-such-job"), "ListJobMetrics"
                ),
            ]
            after = await stub.ListJobMetrics(
                paramserver.ListJobMetricsRequest(job_id=job.job_id), timeout=10
            )
        return answers, before, after

    answers, before, after = asyncio.run(calls())
    codes = [code for code, _ in answers]
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 3 + [
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
    ]
    assert "not finite" in answers[0][1] and "version must be >= 0" in answers[1][1]
    assert after.records == before.records  # nothing recorded by a refused call
