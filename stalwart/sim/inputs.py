"""Recovery inputs: our benchmark JSON when given, else the committed defaults.

Accepted documents (each the ``--output json`` of its command):

- ``stalwart bench recovery``: ``kill_to_next_commit.{trainer,paramserver,coordinator}.median_s``
  and ``...trainer.median_detection_s``.
- ``stalwart bench ddp``: ``ratio`` (or ``throughput_ratio``): Stalwart's throughput over a
  plain DDP run; ``ddp_kill_to_next_step_s`` (what the bench prints; or ``ddp_recovery_s``,
  ``ddp_restart_s``): DDP's restart time, measured.
- ``stalwart bench overhead``: ``ratio``, used for the throughput ratio when no ddp JSON is given.
- ``stalwart bench ckpt``: ``backends.<store>.stall.stall_fraction`` and
  ``backends.<store>.restore_vs_raw_get`` (store ``shm`` unless told).
- health: either flat ``{precision, recall, lead_time_h}`` or the output of
  ``stalwart health eval --output json`` for a prediction data set, from which the method
  named (default: the best ``precursor_ge_2h`` F1) gives precision, recall and mean lead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from stalwart.sim import defaults


class InputError(ValueError):
    """A benchmark document is unreadable or lacks the figures we need."""


@dataclass(frozen=True)
class Measured:
    detection_s: float  # a dead trainer declared dead (local cluster)
    trainer_takeover_s: float  # kill -> next committed step with a warm standby
    ps_promotion_s: float  # paramserver primary kill -> next committed step
    throughput_ratio: float  # Stalwart samples/s over plain DDP
    ddp_restart_s: float  # plain DDP job restart at small scale
    ckpt_stall_fraction: float  # stall per in-memory checkpoint, as a share of a step
    precision: float
    recall: float
    lead_time_h: float
    torchft_ratio: float
    sources: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _read(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def _get(doc: dict, path: str, what: Path):
    node = doc
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise InputError(f"{what}: no {path}")
        node = node[key]
    if not isinstance(node, int | float) or isinstance(node, bool):
        raise InputError(f"{what}: {path} is not a number")
    return float(node)


def _first(doc: dict, keys: tuple[str, ...], what: Path) -> float:
    for key in keys:
        if key in doc:
            return _get(doc, key, what)
    raise InputError(f"{what}: none of {', '.join(keys)}")


def _health(doc: dict, method: str | None, what: Path) -> tuple[float, float, float]:
    if "methods" not in doc:
        return tuple(_get(doc, k, what) for k in ("precision", "recall", "lead_time_h"))
    methods = doc["methods"]
    if method is None:
        method = max(methods, key=lambda m: methods[m].get("precursor_ge_2h", {}).get("f1") or 0)
    if method not in methods:
        raise InputError(f"{what}: no method {method!r} (have {', '.join(methods)})")
    pre = methods[method].get("precursor_ge_2h") or methods[method]["entity"]
    lead = methods[method]["entity"].get("mean_lead")
    return (_get(pre, "precision", what), _get(pre, "recall", what),
            float(lead) if lead is not None else defaults.MEASURED["health"]["lead_time_h"])  # fmt: skip


def load(recovery: Path | None = None, ddp: Path | None = None, overhead: Path | None = None,
         ckpt: Path | None = None, health: Path | None = None, ckpt_store: str = "shm",
         health_method: str | None = None) -> Measured:  # fmt: skip
    """The figures the strategies need, each from its JSON when given, else the defaults."""
    d, a = defaults.MEASURED, defaults.ASSUMED
    sources = {k: f"{v['command']} ({v['date']}, commit {v['commit'][:10]})" for k, v in d.items()}
    sources["ddp"] = "assumed (no stalwart bench ddp figure)"
    det, take, promo = (
        d["recovery"]["detection_s"],
        d["recovery"]["trainer_s"],
        d["recovery"]["paramserver_s"],
    )
    ratio, restart, stall = d["overhead"]["ratio"], a["ddp_restart_s"], d["ckpt"]["stall_fraction"]
    prec, rec, lead = d["health"]["precision"], d["health"]["recall"], d["health"]["lead_time_h"]
    if (doc := _read(recovery)) is not None:
        kinds = "kill_to_next_commit"
        take = _get(doc, f"{kinds}.trainer.median_s", recovery)
        promo = _get(doc, f"{kinds}.paramserver.median_s", recovery)
        if doc[kinds]["trainer"].get("median_detection_s") is not None:  # absent when unseen
            det = _get(doc, f"{kinds}.trainer.median_detection_s", recovery)
        sources["recovery"] = str(recovery)
    if (doc := _read(overhead)) is not None:
        ratio = _get(doc, "ratio", overhead)
        sources["overhead"] = str(overhead)
    if (doc := _read(ddp)) is not None:
        ratio = _first(doc, ("ratio", "throughput_ratio"), ddp)
        restart = _first(doc, ("ddp_kill_to_next_step_s", "ddp_recovery_s", "ddp_restart_s"), ddp)
        sources["ddp"] = sources["overhead"] = str(ddp)
    if (doc := _read(ckpt)) is not None:
        stall = _get(doc, f"backends.{ckpt_store}.stall.stall_fraction", ckpt)
        sources["ckpt"] = f"{ckpt} ({ckpt_store})"
    if (doc := _read(health)) is not None:
        prec, rec, lead = _health(doc, health_method, health)
        sources["health"] = str(health)
    for name, value in (("precision", prec), ("recall", rec)):
        if not 0 < value <= 1:
            raise InputError(f"{name} must be in (0, 1], got {value}")
    if ratio <= 0:
        raise InputError(f"throughput ratio must be positive, got {ratio}")
    return Measured(det, take, promo, ratio, restart, stall, prec, rec, lead,
                    a["torchft_ratio"], sources)  # fmt: skip
