"""Pure parts of ``stalwart bench ddp``: reading the DDP progress file and the step timeline."""

from __future__ import annotations

import pytest

from stalwart.bench import ddp_baseline, steptimeline
from stalwart.bench.ddp_baseline import DdpRun, Progress

PAGE = """\
# HELP stalwart_trainer_step_phase_seconds x
# TYPE stalwart_trainer_step_phase_seconds summary
stalwart_trainer_step_phase_seconds_count{phase="compute"} 10.0
stalwart_trainer_step_phase_seconds_sum{phase="compute"} 0.5
stalwart_trainer_step_phase_seconds_count{phase="push"} 10.0
stalwart_trainer_step_phase_seconds_sum{phase="push"} 2.0
# HELP stalwart_paramserver_push_phase_seconds x
# TYPE stalwart_paramserver_push_phase_seconds summary
stalwart_paramserver_push_phase_seconds_count{phase="apply"} 4.0
stalwart_paramserver_push_phase_seconds_sum{phase="apply"} 0.04
# HELP other_seconds x
# TYPE other_seconds summary
other_seconds_count 3.0
other_seconds_sum 9.0
"""


def test_parse_keeps_only_the_phase_families():
    got = steptimeline.parse(PAGE)
    assert got == {
        "trainer.compute": [0.5, 10.0],
        "trainer.push": [2.0, 10.0],
        "paramserver.apply": [0.04, 4.0],
    }


def test_per_step_ms_is_the_mean_over_the_window_only():
    before = {"trainer.compute": [0.5, 10.0], "trainer.push": [2.0, 10.0]}
    after = {"trainer.compute": [0.8, 20.0], "trainer.push": [2.0, 10.0]}
    # compute: 0.3 s over 10 observations; push saw none in the window: left out
    assert steptimeline.per_step_ms(before, after) == {"trainer.compute": 30.0}


def test_median_phases_per_key():
    rows = [
        {"trainer.pull": 1.0},
        {"trainer.pull": 3.0, "trainer.push": 5.0},
        {"trainer.pull": 2.0},
    ]
    assert steptimeline.median_phases(rows) == {"trainer.pull": 2.0, "trainer.push": 5.0}


def _progress(steps, t0: float, dt: float, restart: int = 0) -> list[Progress]:
    return [Progress(s, t0 + i * dt, restart) for i, s in enumerate(steps)]


def test_steady_rate_starts_at_the_warmup_step_of_the_first_attempt():
    progress = _progress(range(0, 5), 0.0, 1.0) + _progress(range(5, 50), 100.0, 0.1)
    # steps 10..49 (39 intervals) took 3.9 s; the slow start-up steps are left out
    assert ddp_baseline.steady_steps_per_s(progress, 10) == pytest.approx(10.0)


def test_recovery_counts_the_steps_done_again():
    progress = _progress(range(0, 153), 0.0, 0.01) + _progress(range(150, 160), 20.0, 0.01, 1)
    run = DdpRun(0.0, {}, progress, killed_at=1.6)
    ddp_baseline._recovery(run)
    assert run.recovery_s == pytest.approx(18.4)
    assert run.steps_repeated == 3  # 150, 151, 152 were done before the kill and again after


def test_local_sgd_side_reads_the_same_batches_in_outer_steps():
    from stalwart.bench import ddp

    plain = ddp.workload(400)
    spec = ddp.LocalSgd(8, inner_lr=0.1, outer_lr=0.7, outer_momentum=0.9).spec(400)
    assert spec.steps * spec.local_steps == plain.steps  # 50 outer x 8 inner = 400 batches
    assert (spec.num_slots, spec.batch_size, spec.model_args) == (
        plain.num_slots, plain.batch_size, plain.model_args,
    )  # fmt: skip
    assert spec.local_lr == 0.1
    opt = spec.optimizer
    assert (opt.lr, opt.momentum, opt.nesterov) == (0.7, 0.9, True)
    averaging = ddp.LocalSgd(4, outer_lr=1.0, outer_momentum=0.0).spec(400).optimizer
    assert (averaging.momentum, averaging.nesterov) == (0.0, False)


def test_local_sgd_result_names_rates_by_what_they_count():
    from stalwart.bench import ddp

    result = {"workload": "w", "stalwart_steps_per_s": 24.0, "ratio": 1.2, "kill_at_step": 150}
    ours = [{"steps_per_s": 3.0, "accuracy": 0.96664}]
    theirs = [{"steps_per_s": 20.0, "accuracy": 0.95}]
    out = ddp._local_fields(result, ddp.LocalSgd(8), ours, theirs)
    assert "stalwart_steps_per_s" not in out
    assert (out["stalwart_inner_steps_per_s"], out["stalwart_outer_steps_per_s"]) == (24.0, 3.0)
    assert (out["stalwart_accuracy"], out["ddp_accuracy"]) == (0.9666, 0.95)
    assert out["ratio"] == 1.2 and out["stalwart_kill_at_outer_step"] == 18
    assert ours == [{"outer_steps_per_s": 3.0, "accuracy": 0.96664}]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "404", "--local-steps", "8"], "multiple of --local-steps 8"),
        (["--steps", "400", "--warmup", "4", "--local-steps", "8"], "warmup/H"),
        (["--steps", "400", "--local-steps", "8", "--local-lr", "0"], "--local-lr"),
    ],
)
def test_bench_ddp_refuses_local_settings_it_cannot_time(args, message):
    from typer.testing import CliRunner

    from stalwart.cli.main import app
    from stalwart.cli.output import ExitCode

    result = CliRunner().invoke(app, ["bench", "ddp", *args])
    assert result.exit_code == ExitCode.INVALID_INPUT, result.output
    assert result.output.startswith("Error:") and message in result.output


def test_bf16_gradients_change_only_the_stalwart_sides_spec_and_name_it():
    from stalwart.api import common
    from stalwart.bench import ddp

    plain = ddp.workload(40)
    ours = ddp._bf16(plain)
    assert ours.gradient_dtype == common.DTYPE_BFLOAT16
    assert plain.gradient_dtype == common.DTYPE_UNSPECIFIED  # DDP's side as it was
    ours.gradient_dtype = common.DTYPE_UNSPECIFIED
    assert ours == plain
    rows = [{"accuracy": a} for a in (0.9, 0.95, 0.93)]
    got = ddp._bf16_fields({"workload": "w", "ratio": 0.7}, rows, [{"accuracy": 0.94}])
    assert got == {"workload": "w; Stalwart side: gradients as bfloat16",
                   "gradient_dtype": "bfloat16", "stalwart_accuracy": 0.93,
                   "ddp_accuracy": 0.94, "ratio": 0.7}  # fmt: skip
