"""Run strategies side by side over GPU counts and seeds; the sanity anchors; sensitivity."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from stalwart.sim import failures, published, scaling, trace
from stalwart.sim.inputs import Measured
from stalwart.sim.strategies import Common, RestartAll, Stalwart, StalwartParams, Strategy, TorchFT

STRATEGIES = ("restart-all", "torchft", "stalwart", "stalwart+drain")
FAILURE_SOURCES = ("llama3", "meta", "trace")

#: Called once per simulated seed of one GPU count (a progress bar's tick).
Tick = Callable[[], None]


def _no_tick() -> None:
    pass


@dataclass(frozen=True)
class SimConfig:
    gpus: tuple[int, ...] = (1024, 16_384, 100_000)
    days: float = 54.0
    seeds: int = 3
    seed: int = 0
    failures: str = "llama3"
    strategies: tuple[str, ...] = STRATEGIES
    standbys: int = 2
    refill: str = "scheduler"
    precursor_share: float = 0.3
    recall: float | None = None  # None: the measured one
    gray_per_failure: float = 0.25
    workload: dict = field(default_factory=dict)  # Workload overrides (not gpus)
    common: dict = field(default_factory=dict)  # Common overrides


def failure_model(cfg: SimConfig, fit: trace.TraceFit | None) -> failures.FailureModel:
    if cfg.failures == "trace":
        if fit is None:
            raise trace.TraceMissing("--failures trace needs the trace on disk")
        model = failures.from_trace(fit)
    else:
        model = {"llama3": failures.llama3, "meta": failures.meta}[cfg.failures](fit)
    return dataclasses.replace(model, gray_per_failure=cfg.gray_per_failure)


def build(name: str, common: Common, m: Measured, cfg: SimConfig) -> Strategy:
    if name == "restart-all":
        return RestartAll(common, m.ddp_restart_s)
    if name == "torchft":
        return TorchFT(common, m.ddp_restart_s, m.torchft_ratio)
    params = StalwartParams(
        standbys=cfg.standbys, detection_s=m.detection_s, takeover_s=m.trainer_takeover_s,
        ps_promotion_s=m.ps_promotion_s, throughput_ratio=m.throughput_ratio,
        ckpt_stall_fraction=m.ckpt_stall_fraction, ddp_restart_s=m.ddp_restart_s,
        drain=name == "stalwart+drain", precision=m.precision,
        recall=m.recall if cfg.recall is None else cfg.recall, lead_time_h=m.lead_time_h,
        precursor_share=cfg.precursor_share, refill=cfg.refill,
    )  # fmt: skip
    return Stalwart(common, params)


def _mean_dicts(dicts: list[dict]) -> dict:
    keys = sorted({k for d in dicts for k in d})
    return {k: round(statistics.mean(d.get(k, 0) for d in dicts), 6) for k in keys}


def run_one(cfg: SimConfig, m: Measured, model: failures.FailureModel, gpus: int,
            names: tuple[str, ...], tick: Tick = _no_tick) -> list[dict]:  # fmt: skip
    """Every strategy at one N, each seed's hardware events shared by all strategies."""
    w = scaling.Workload(gpus=gpus, **cfg.workload)
    horizon = cfg.days * failures.DAY
    per: dict[str, list[dict]] = {n: [] for n in names}
    for s in range(cfg.seed, cfg.seed + cfg.seeds):
        events = failures.sample(model, gpus, w.gpus_per_node, horizon, s)
        common = Common(workload=w, model=model, seed=s, **cfg.common)
        for name in names:
            per[name].append(build(name, common, m, cfg).run(events, horizon))
        tick()
    rows = []
    for name, runs in per.items():
        ettr = [r["ettr"] for r in runs]
        first = runs[0]
        rows.append({
            "gpus": gpus, "strategy": name,
            "ettr": round(statistics.mean(ettr), 5), "ettr_min": round(min(ettr), 5),
            "ettr_max": round(max(ettr), 5), "throughput_ratio": first["throughput_ratio"],
            "effective_throughput": round(statistics.mean(r["effective_throughput"] for r in runs), 5),
            "mtbf_h": round(model.mtbf_h(gpus), 3),
            "checkpoint_interval_s": round(first["checkpoint_interval_s"], 1),
            "checkpoint_s": round(first["checkpoint_s"], 2),
            "waste": _mean_dicts([r["waste"] for r in runs]),
            "counts": _mean_dicts([r["counts"] for r in runs]),
        } | ({"standbys": first["standbys"],
              "pool_empty_share": round(statistics.mean(r["pool_empty_share"] for r in runs), 5)}
             if "standbys" in first else {}))  # fmt: skip
    return rows


def simulate(
    cfg: SimConfig, m: Measured, fit: trace.TraceFit | None, tick: Tick = _no_tick
) -> list[dict]:
    model = failure_model(cfg, fit)
    return [row for n in cfg.gpus for row in run_one(cfg, m, model, n, cfg.strategies, tick)]


# --- sanity against published results ----------------------------------------------------

# Llama 3: restart-all with its own job, storage and failures (planned restarts included).
LLAMA3_ANCHOR = {"gpus": published.LLAMA3_GPUS, "days": published.LLAMA3_DAYS}
# ByteRobust-like: restart-all mechanics with what ByteRobust publishes it does: warm standby
# machines (no waiting for the scheduler), in-memory checkpoints every few steps with a near
# zero stall, read back from peers' memory, and automated detection of hangs within a minute.
BYTEROBUST_COMMON = {"replace_s": 0.0, "ckpt_s": 1.0, "load_s": 10.0, "crash_detect_s": 10.0,
                     "hang_detect_s": 60.0, "gray_detect_s": 600.0}  # fmt: skip


def anchors(
    cfg: SimConfig, m: Measured, fit: trace.TraceFit | None, tick: Tick = _no_tick
) -> list[dict]:
    base = dataclasses.replace(cfg, failures="llama3", strategies=("restart-all",))
    model = failure_model(base, fit)
    llama = dataclasses.replace(base, days=published.LLAMA3_DAYS)
    row_l = run_one(llama, m, model, published.LLAMA3_GPUS, ("restart-all",), tick)[0]
    bytedance = dataclasses.replace(base, days=published.BYTEROBUST_DAYS,
                                    common={**cfg.common, **BYTEROBUST_COMMON})  # fmt: skip
    no_planned = dataclasses.replace(model, planned_per_gpu_hour=0.0)
    row_b = run_one(bytedance, m, no_planned, published.BYTEROBUST_GPUS, ("restart-all",), tick)[0]
    return [
        {"anchor": "Llama 3 (restart-all, its settings)", "gpus": published.LLAMA3_GPUS,
         "published": f"> {published.LLAMA3_EFFECTIVE_TRAINING_TIME:.0%} effective training time",
         "published_value": published.LLAMA3_EFFECTIVE_TRAINING_TIME,
         "simulated_ettr": row_l["ettr"], "source": published.LLAMA3_SOURCE, "row": row_l},
        {"anchor": "ByteRobust-like (restart-all, fast paths)", "gpus": published.BYTEROBUST_GPUS,
         "published": f"{published.BYTEROBUST_ETTR:.0%} ETTR",
         "published_value": published.BYTEROBUST_ETTR,
         "simulated_ettr": row_b["ettr"], "source": published.BYTEROBUST_SOURCE, "row": row_b},
    ]  # fmt: skip


# --- sensitivity --------------------------------------------------------------------------

POOL_SIZES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
INTERVAL_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
RECALLS = (0.0, 0.25, 0.5, 0.75, 1.0)
INTERVAL_STRATEGIES = ("restart-all", "torchft", "stalwart")
SENSITIVITY_RUNS = len(POOL_SIZES) + len(INTERVAL_STRATEGIES) * len(INTERVAL_SCALES) + len(RECALLS)


def sensitivity(
    cfg: SimConfig, m: Measured, fit: trace.TraceFit | None, gpus: int, tick: Tick = _no_tick
) -> dict:
    model = failure_model(cfg, fit)

    def ettr(c: SimConfig, name: str) -> dict:
        row = run_one(c, m, model, gpus, (name,), tick)[0]
        return {k: row[k] for k in ("ettr", "effective_throughput")} | (
            {"pool_empty_share": row["pool_empty_share"]} if "pool_empty_share" in row else {}
        )

    repair = dataclasses.replace(cfg, refill="repair")
    pool = [{"standbys": k, **ettr(dataclasses.replace(repair, standbys=k), "stalwart")}
            for k in POOL_SIZES]  # fmt: skip
    interval = [{"scale": s, "strategy": n,
                 **ettr(dataclasses.replace(cfg, common={**cfg.common, "ckpt_interval_scale": s}), n)}
                for n in INTERVAL_STRATEGIES for s in INTERVAL_SCALES]  # fmt: skip
    recall = [{"recall": r, **ettr(dataclasses.replace(cfg, recall=r), "stalwart+drain")}
              for r in RECALLS]  # fmt: skip
    return {
        "gpus": gpus,
        "pool_size_refill_by_repair": pool,
        "checkpoint_interval_vs_young_daly": interval,
        "predictor_recall": recall,
    }


# --- the whole document -------------------------------------------------------------------


def seed_runs(cfg: SimConfig, with_anchors: bool, sensitivity_gpus: int | None) -> int:
    """How many times :func:`document` calls its ``tick``: one per seed of each run."""
    runs = (
        len(cfg.gpus) + (2 if with_anchors else 0) + (SENSITIVITY_RUNS if sensitivity_gpus else 0)
    )
    return runs * cfg.seeds


def document(cfg: SimConfig, m: Measured, fit: trace.TraceFit | None, with_anchors: bool = True,
             sensitivity_gpus: int | None = None, tick: Tick = _no_tick) -> dict:  # fmt: skip
    """Results per strategy and N, the anchors, optional sensitivity, and every input used."""
    model = failure_model(cfg, fit)
    results = simulate(cfg, m, fit, tick)
    doc = {
        "summary": (f"{cfg.days:g} days of one job, mean of {cfg.seeds} seed(s) from {cfg.seed}; "
                    f"failures: {model.source}; {cfg.standbys} warm standbys "
                    f"(refilled by {cfg.refill})."),
        "results": results,
        "anchors": anchors(cfg, m, fit, tick) if with_anchors else [],
        "inputs": {
            "config": {k: (list(v) if isinstance(v, tuple) else v)
                       for k, v in dataclasses.asdict(cfg).items()},
            "failures": model.to_dict(list(cfg.gpus)),
            "trace_fit": fit.to_dict() if fit else None,
            "measured": m.to_dict(),
            "workload": scaling.Workload(gpus=cfg.gpus[0], **cfg.workload).to_dict(),
            "common": {k: v for k, v in dataclasses.asdict(
                Common(workload=scaling.Workload(gpus=1024), model=model, seed=0, **cfg.common)
            ).items() if k not in ("workload", "model", "seed")},
        },
    }  # fmt: skip
    if sensitivity_gpus:
        doc["sensitivity"] = sensitivity(cfg, m, fit, sensitivity_gpus, tick)
    return doc
