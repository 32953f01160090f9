"""Fleet telemetry from a CSV export, read in one streaming pass.

Rows are parsed one at a time and kept per entity in compact typed arrays (4 bytes a
metric value), so memory grows with the data's numbers, not with Python objects per
cell. Every bad input is refused with a ``CsvError``: one line naming the row (the
file's line number, header = row 1) and the column. ``SCHEMA`` is the contract.
"""

from __future__ import annotations

import csv
import re
import sys
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from services.health.datasets import DetectionSet, Entity, Machine, PredictionSet
from services.health.memory import release_freed

SCHEMA = """\
CSV schema (header row required, comma-separated, one row per poll):
  entity        id of the machine/module/node the row belongs to (string, required)
  timestamp     ISO 8601 (a zone offset or Z; none means UTC) or a number in --time-unit
                (hours by default; s or ms for epoch seconds or milliseconds) (required)
  <metrics...>  every other column: a number; empty or nan = missing. For prediction:
                *_total   cumulative counter (a drop is a reset: it restarted from 0)
                *_delta   per-poll increment (a negative value is a reset artefact: 0)
  label         0/1 per row: anomaly detection                        -- one of these two
  failure_time  when the entity failed, same forms as timestamp; empty if it never did;
                the same on every row of the entity: failure prediction
  split         optional, train or test: per row for detection, per entity for prediction
The same columns in a Parquet file (PATH ending .parquet or .pq), read in record
batches: times as numbers, Arrow timestamps or ISO text; metrics numeric (or text
holding numbers); null = missing. Rows are numbered as in the CSV (first data row = 2).
Polls missing at the declared --poll-interval (default: the file's median spacing) are
inserted as missed polls. --profile transceiver: columns NAME_0, NAME_1, ... are lanes
of one quantity, and the transceiver window, shift and loss settings apply.
"""

RESERVED = ("entity", "timestamp", "label", "failure_time", "split")
TIME_UNITS = {"h": 1.0, "hours": 1.0, "s": 1 / 3600, "seconds": 1 / 3600, "ms": 1 / 3.6e6}
PROFILES = ("transceiver",)
_LANE = re.compile(r"^(.*)_(\d+)$")
_MISSING = ("", "nan", "NaN", "NA")
PROGRESS_MIN_BYTES = 8 << 20  # smaller files are read without a bar


class CsvError(ValueError):
    """A CSV file that does not follow SCHEMA; the message is one line."""


@dataclass
class CsvOptions:
    horizon: float = 24.0  # hours
    seed: int = 0
    poll_interval: float | None = None  # hours; None = the file's median spacing
    time_unit: str = "h"
    profile: str | None = None
    progress: bool = True


@dataclass
class _Rows:
    """One entity's rows as typed arrays, in file order."""

    t: array = field(default_factory=lambda: array("d"))
    x: array = field(default_factory=lambda: array("f"))  # row-major, d values a row
    label: array = field(default_factory=lambda: array("b"))
    train: array = field(default_factory=lambda: array("b"))  # per row: 1 train, 0 test, -1 none
    failure: tuple[float, int] | None = None  # (time, first row giving it)
    split_row: dict[int, int] = field(default_factory=dict)  # split value -> first row


def parse_time(value: str, unit: float) -> float:
    """ISO 8601 or a number in ``unit`` hours -> hours since the epoch (numbers: as given)."""
    try:
        return float(value) * unit
    except ValueError:
        dt = datetime.fromisoformat(value.strip())
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp() / 3600.0


class _Progress:
    """A bar on stderr while a big file is read; quiet for small files."""

    def __init__(self, path: Path, enabled: bool):
        self.total = path.stat().st_size
        self.on = enabled and self.total >= PROGRESS_MIN_BYTES
        self.done, self.shown = 0, -1

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        pct = int(100 * self.done / self.total) if self.total else 100
        if self.on and pct != self.shown and (sys.stderr.isatty() or pct % 10 == 0):
            self.shown = pct
            bar = "#" * (pct // 4)
            end = "\r" if sys.stderr.isatty() and pct < 100 else "\n"
            print(f"reading {self.done >> 20} MiB [{bar:25s}] {pct:3d}%", end=end,
                  file=sys.stderr, flush=True)


def _lines(path: Path, progress: _Progress):
    with path.open("rb") as fh:
        for raw in fh:
            progress.advance(len(raw))
            yield raw.decode("utf-8")


def _header(reader, path: Path) -> list[str]:
    header = [c.strip() for c in next(reader, [])]
    for col in ("entity", "timestamp"):
        if col not in header:
            raise CsvError(f"{path}: row 1 (header): missing column '{col}' (schema: "
                           "stalwart health eval --help)")
    if ("label" in header) == ("failure_time" in header):
        raise CsvError(f"{path}: row 1 (header): need exactly one of the columns 'label' "
                       "(detection) or 'failure_time' (prediction)")
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise CsvError(f"{path}: row 1 (header): column '{dup[0]}' appears twice")
    return header


def _stream(path: Path, opts: CsvOptions):
    unit = TIME_UNITS.get(opts.time_unit)
    if unit is None:
        raise CsvError(f"--time-unit {opts.time_unit!r}: one of {', '.join(TIME_UNITS)}")
    reader = csv.reader(_lines(path, _Progress(path, opts.progress)))
    header = _header(reader, path)
    col = {c: header.index(c) for c in RESERVED if c in header}
    metrics = [c for c in header if c not in RESERVED]
    mcols = [header.index(c) for c in metrics]
    ents: dict[str, _Rows] = {}
    row = 1
    for fields in reader:
        row += 1
        if not fields:
            continue
        if len(fields) != len(header):
            raise CsvError(f"{path}: row {row}: {len(fields)} fields, the header has "
                           f"{len(header)}")
        _add(ents, fields, row, col, mcols, header, unit, path)
    return metrics, ents, "label" in col


def _bad(path, row, name, value, what) -> CsvError:
    return CsvError(f"{path}: row {row}, column '{name}': {value!r} is not {what}")


def _add(ents, f, row, col, mcols, header, unit, path) -> None:
    name = f[col["entity"]].strip()
    if not name:
        raise CsvError(f"{path}: row {row}, column 'entity': empty")
    e = ents.get(name) or ents.setdefault(name, _Rows())
    try:
        e.t.append(parse_time(f[col["timestamp"]], unit))
    except ValueError:
        raise _bad(path, row, "timestamp", f[col["timestamp"]],
                   "a number or an ISO 8601 time") from None
    for c in mcols:
        v = f[c].strip()
        try:
            e.x.append(float("nan") if v in _MISSING else float(v))
        except ValueError:
            raise _bad(path, row, header[c], v, "a number (empty = missing)") from None
    if "label" in col:
        v = f[col["label"]].strip()
        if v not in ("0", "1", ""):
            raise _bad(path, row, "label", v, "0 or 1")
        e.label.append(v == "1")
    else:
        _failure(e, f[col["failure_time"]].strip(), row, unit, path)
    _split(e, f[col["split"]].strip().lower() if "split" in col else "", row, path)


def _failure(e: _Rows, v: str, row: int, unit: float, path) -> None:
    try:
        ft = float("nan") if v in _MISSING else parse_time(v, unit)
    except ValueError:
        raise _bad(path, row, "failure_time", v, "empty, a number or an ISO 8601 time") from None
    if e.failure is None:
        e.failure = (ft, row)
    elif not (ft == e.failure[0] or (np.isnan(ft) and np.isnan(e.failure[0]))):
        raise CsvError(f"{path}: row {row}, column 'failure_time': {v!r} differs from the "
                       f"entity's failure time on row {e.failure[1]}")


def _split(e: _Rows, v: str, row: int, path) -> None:
    if v not in ("", "train", "test"):
        raise _bad(path, row, "split", v, "train or test")
    s = {"": -1, "train": 1, "test": 0}[v]
    e.train.append(s)
    e.split_row.setdefault(s, row)


def _blocks(e: _Rows, d: int):
    """Rows sorted by time (stable): t, x (n, d), labels, per-row split."""
    t = np.frombuffer(e.t, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    x = np.frombuffer(e.x, dtype=np.float32).reshape(len(t), d)
    lab = np.frombuffer(e.label, dtype=np.int8)
    tr = np.frombuffer(e.train, dtype=np.int8)
    return t[order], x[order], (lab[order] if lab.size else lab), tr[order]


def fill_gaps(t: np.ndarray, x: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Insert a missed poll (a row of NaN) wherever consecutive polls are further apart
    than 1.5 ``step``: a dropped poll is a gap the model should see, not a shorter
    interval between two readings."""
    if len(t) < 2 or not step > 0:
        return t, x
    k = np.maximum(np.rint(np.diff(t) / step).astype(np.int64), 1)
    k[np.diff(t) <= 1.5 * step] = 1
    pos = np.concatenate([[0], np.cumsum(k)])
    n = int(pos[-1]) + 1
    real = np.zeros(n, dtype=bool)
    real[pos] = True
    prev = np.maximum.accumulate(np.where(real, np.arange(n), 0))
    tt = np.empty(n)
    tt[pos] = t
    tt = tt[prev] + (np.arange(n) - prev) * step
    xx = np.full((n, x.shape[1]), np.nan, dtype=np.float32)
    xx[pos] = x
    return tt, xx


def load(path: str, opts: CsvOptions | None = None) -> DetectionSet | PredictionSet:
    opts = opts or CsvOptions()
    p = Path(path)
    if opts.profile is not None and opts.profile not in PROFILES:
        raise CsvError(f"--profile {opts.profile!r}: one of {', '.join(PROFILES)}")
    if not p.is_file():
        raise CsvError(f"fleet file {p} not found (schema: stalwart health eval --help)")
    from services.health import fleetparquet  # pyarrow only for Parquet files

    read = fleetparquet.stream if fleetparquet.is_parquet(p) else _stream
    metrics, ents, detection = read(p, opts)
    if not ents:
        raise CsvError(f"{p}: no data rows after the header")
    out = _detection(p.name, metrics, ents) if detection else _prediction(p, metrics, ents, opts)
    del ents
    release_freed()  # the raw rows, freed entity by entity
    return out


def _detection(name: str, metrics: list[str], ents: dict[str, _Rows]) -> DetectionSet:
    machines = []
    for ent, e in ents.items():
        _, x, y, tr = _blocks(e, len(metrics))
        is_train = tr == 1 if (tr >= 0).any() else np.arange(len(x)) < len(x) // 2
        if not is_train.any() or is_train.all():
            raise CsvError(f"{name}: entity '{ent}' has no "
                           f"{'test' if is_train.all() else 'train'} rows")
        # Detectors train unlabelled, so missing values are filled from the column
        # median of the training part (forward-fill would need an order-aware model).
        med = np.nan_to_num(np.nanmedian(x[is_train], axis=0))
        x = np.where(np.isnan(x), med, x).astype(np.float32)
        machines.append(Machine(ent, x[is_train], x[~is_train], y[~is_train]))
    return DetectionSet(f"csv:{name}", machines)


def _entity_split(p: Path, ent: str, e: _Rows) -> str | None:
    given = {s: r for s, r in e.split_row.items() if s >= 0}
    if len(given) > 1 or (given and -1 in e.split_row):
        rows = sorted(e.split_row.values())
        raise CsvError(f"{p}: row {rows[1]}, column 'split': entity '{ent}' is in more than "
                       f"one split (rows {rows[0]} and {rows[1]}); a module is either "
                       "trained on or tested on")
    return {1: "train", 0: "test"}.get(next(iter(given), -1))


def _lanes(metrics: list[str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for m in metrics:
        hit = _LANE.match(m)
        if hit:
            groups.setdefault(hit.group(1), []).append(m)
    return [sorted(g, key=lambda c: int(_LANE.match(c).group(2)))
            for g in groups.values() if len(g) > 1]


def _median_spacing(ents: dict[str, _Rows]) -> float:
    gaps = [np.diff(np.sort(np.frombuffer(e.t))) for e in ents.values() if len(e.t) > 1]
    return float(np.median(np.concatenate(gaps))) if gaps else 1.0


def _prediction(p: Path, metrics, ents: dict[str, _Rows], opts: CsvOptions) -> PredictionSet:
    step = opts.poll_interval or _median_spacing(ents)
    out, split = [], {}
    for ent, e in ents.items():
        t, x, _, _ = _blocks(e, len(metrics))
        f = e.failure[0]
        keep = ~(t >= f) if np.isfinite(f) else np.ones(len(t), bool)  # the dead module
        t, x = fill_gaps(t[keep], x[keep], step)
        out.append(Entity(ent, t, x, f, "failing" if np.isfinite(f) else "healthy"))
        split[ent] = _entity_split(p, ent, e)
        # The raw rows are copied into the entity: free them now, so a large export
        # is held once, not twice, at the peak.
        e.t, e.x, e.label, e.train = array("d"), array("f"), array("b"), array("b")
    if any(s is None for s in split.values()):
        if any(s is not None for s in split.values()):
            raise CsvError(f"{p}: column 'split': given for some entities and not others")
        order = np.random.default_rng(opts.seed).permutation(len(out))
        cut = int(round(0.7 * len(out)))
        split = {out[i].name: ("train" if k < cut else "test") for k, i in enumerate(order)}
    counters = [m for m in metrics if m.endswith("_total")]
    notes = {"counters": counters, "deltas": [m for m in metrics if m.endswith("_delta")]}
    if opts.profile == "transceiver":
        from services.health.transceiver import NOTES

        notes["counters"] += [m for m in NOTES["counters"] if m in metrics]
        notes.update(profile="transceiver", lanes=_lanes(metrics))
    return PredictionSet(
        name=f"csv:{p.name}", channels=metrics,
        train=[e for e in out if split[e.name] == "train"],
        test=[e for e in out if split[e.name] == "test"],
        horizon=opts.horizon, time_unit="hours", step=step, notes=notes,
    )

