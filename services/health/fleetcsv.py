"""Fleet telemetry from a CSV export, read in one streaming pass.

pyarrow's streaming CSV reader cuts the file into blocks of ``BLOCK_BYTES``, every
column as text; each block goes through ``fleetbatch.add_batch``, the code Parquet's
record batches go through, which checks and converts whole columns and keeps the rows
per entity in compact typed arrays (4 bytes a metric value; 12 a cumulative counter's,
see ``exact_columns``). Memory is one block plus the data's numbers. Every bad input
is refused with a ``CsvError``: one line naming the row (the file's line number,
header = row 1) and the column. ``SCHEMA`` is the contract.
"""

from __future__ import annotations

import csv
import re
import sys
import warnings
from array import array
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from services.health.datasets import DetectionSet, Entity, Machine, PredictionSet
from services.health.fleetbatch import CsvError, EntityRows, add_batch
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
inserted as missed polls. A row repeating its entity's timestamp and values is a poll
sent twice and read once; with other values, the file is refused. --profile
transceiver: columns NAME_0, NAME_1, ... are lanes of one quantity, and the
transceiver window, shift and loss settings apply.
"""

RESERVED = ("entity", "timestamp", "label", "failure_time", "split")
TIME_UNITS = {"h": 1.0, "hours": 1.0, "s": 1 / 3600, "seconds": 1 / 3600, "ms": 1 / 3.6e6}
PROFILES = ("transceiver",)
_LANE = re.compile(r"^(.*)_(\d+)$")
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")  # what pandas' to_parquet names its index
PROGRESS_MIN_BYTES = 8 << 20  # smaller files are read without a bar
MIN_TRAIN_ROWS = 2  # per detection entity: detectors fit on 80% and set thresholds on the rest
MISSED_POLLS_FREE = 1000  # missed polls any entity may have, whatever its length
_EPOCH_1990_H = 175_320.0  # hours from 1970 to 1990: later numbers read as dates too
_EPOCH_9999_H = 70_000_000.0  # past year 9999 there is no date to show
BLOCK_BYTES = 1 << 20
"""A CSV file is read in blocks of this many bytes, a batch each (about 8,000 rows of the
transceiver export). Arrow's default; the read's peak grew with it (407 MiB max RSS
reading the 400 MB export at 1 MiB, 457 at 2, 632 at 8), its time did not shrink."""


@dataclass
class CsvOptions:
    horizon: float = 24.0  # hours
    seed: int = 0
    poll_interval: float | None = None  # hours; None = the file's median spacing
    time_unit: str = "h"
    profile: str | None = None
    progress: bool = True
    parquet: bool | None = None  # None: by the file's suffix (.parquet, .pq)


class _Progress:
    """A bar on stderr while a big file is read; quiet for small files."""

    def __init__(self, path: Path, enabled: bool):
        self.total = path.stat().st_size
        self.on = enabled and self.total >= PROGRESS_MIN_BYTES
        self.done, self.shown = 0, 0

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        pct = int(100 * self.done / self.total) if self.total else 100
        step = 1 if sys.stderr.isatty() else 10  # a log gets a line every 10%, none skipped
        if self.on and pct // step > self.shown // step:
            self.shown = pct
            bar = "#" * (pct // 4)
            end = "\r" if sys.stderr.isatty() and pct < 100 else "\n"
            print(
                f"reading {self.done >> 20} MiB [{bar:25s}] {pct:3d}%",
                end=end,
                file=sys.stderr,
                flush=True,
            )


def check_header(path: Path, names: list[str], where: str) -> list[str]:
    """The column names, refused unless SCHEMA's columns are there once each; ``where``
    names the header in messages (a CSV's row 1, a Parquet file's schema)."""
    if not any(names):
        raise CsvError(f"{path}: {where}: no column names (an empty file?)")
    for col in ("entity", "timestamp"):
        if col not in names:
            raise CsvError(
                f"{path}: {where}: missing column '{col}'{_delimiter_hint(names)} "
                "(schema: stalwart health eval --help)"
            )
    if ("label" in names) == ("failure_time" in names):
        raise CsvError(
            f"{path}: {where}: need exactly one of the columns 'label' "
            "(detection) or 'failure_time' (prediction)"
        )
    for i, c in enumerate(names):
        if not c.strip() or _PANDAS_INDEX.fullmatch(c):
            why = ("has no name: a comma at the end of every line, or pandas' index "
                   "(write with index=False)?" if not c.strip()
                   else f"{c!r} is pandas' index: write the file with index=False")  # fmt: skip
            raise CsvError(f"{path}: {where}: column {i + 1} {why}")
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise CsvError(f"{path}: {where}: column '{dup[0]}' appears twice")
    if all(c in RESERVED for c in names):
        raise CsvError(
            f"{path}: {where}: no metric column (every column besides "
            f"{', '.join(RESERVED)} is a metric)"
        )
    return list(names)


def _delimiter_hint(names: list[str]) -> str:
    """A lone header cell holding another separator: the file is not comma-separated."""
    if len(names) == 1:
        for sep in (";", "\t", "|"):
            if sep in names[0]:
                return (
                    f" (the header is one column {names[0]!r}: fields must be separated by commas)"
                )
    return ""


def _header(path: Path) -> list[str]:
    """Row 1, read with Python's csv module (the rows after it are Arrow's to read)."""
    with path.open("rb") as fh:
        first = fh.readline()
    try:
        # utf-8-sig: spreadsheet exports often begin with a byte-order mark
        names = [c.strip() for c in next(csv.reader([first.decode("utf-8-sig")]), [])]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CsvError(f"{path}: row 1 (header): cannot be read ({exc})") from None
    return check_header(path, names, "row 1 (header)")


class _FieldCount:
    """Arrow's reader calls this for a row whose field count is not the header's: the
    row is refused with its line number (known: the reader is single threaded)."""

    def __init__(self, path: Path, fields: int):
        self.path, self.fields = path, fields
        self.error: CsvError | None = None

    def __call__(self, bad) -> str:
        self.error = CsvError(
            f"{self.path}: row {bad.number}: {bad.actual_columns} fields, "
            f"the header has {self.fields}"
        )
        return "error"


def _stream(path: Path, opts: CsvOptions):
    """(metrics, per-entity rows, is detection): Arrow's streaming CSV reader, every
    column as text, each block through ``fleetbatch.add_batch`` as Parquet's batches."""
    import pyarrow as pa

    unit = TIME_UNITS.get(opts.time_unit)
    if unit is None:
        raise CsvError(f"--time-unit {opts.time_unit!r}: one of {', '.join(TIME_UNITS)}")
    header = _header(path)
    metrics = [c for c in header if c not in RESERVED]
    detection = "label" in header
    exact = exact_columns(metrics, detection, opts.profile)
    fields = _FieldCount(path, len(header))
    progress = _Progress(path, opts.progress)
    ents: dict[str, EntityRows] = {}
    row = 2  # the line of the next batch's first row
    with path.open("rb") as fh:
        try:
            for batch in _batches(fh, header, fields):
                rows = np.arange(row, row + batch.num_rows)
                row += batch.num_rows
                add_batch(ents, *_without_blank_lines(batch, rows), metrics, detection, unit, path,
                          exact)  # fmt: skip
                progress.advance(fh.tell() - progress.done)
        except pa.ArrowInvalid as exc:
            if fields.error is not None:
                raise fields.error from None
            raise CsvError(
                f"{path}: rows from row {row} on cannot be read ({_first_line(exc)})"
            ) from None
    progress.advance(progress.total - progress.done)
    return metrics, ents, detection


def _batches(fh, header: list[str], fields: _FieldCount):
    """Record batches of text columns, one per ``BLOCK_BYTES`` of the file. Blank lines
    come as rows (of empty cells), so every line has its row and rows keep their line
    numbers; single threaded, so Arrow knows a bad row's line number too."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    read = pacsv.ReadOptions(
        column_names=header, skip_rows=1, block_size=BLOCK_BYTES, use_threads=False
    )
    parse = pacsv.ParseOptions(
        newlines_in_values=True, ignore_empty_lines=False, invalid_row_handler=fields
    )
    text = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in header}, strings_can_be_null=False
    )
    yield from pacsv.open_csv(fh, read_options=read, parse_options=parse, convert_options=text)


def _without_blank_lines(batch, rows: np.ndarray):
    """The batch less its rows of empty cells only (blank lines, or a row of commas):
    skipped, as a blank line always was; a row with any cell given is checked."""
    import pyarrow.compute as pc

    blank = pc.equal(batch.column(0), "")
    if not pc.any(blank).as_py():  # the usual case: one comparison a batch
        return batch, rows
    for column in batch.columns[1:]:
        blank = pc.and_(blank, pc.equal(column, ""))
    keep = pc.invert(blank)
    return batch.filter(keep), rows[keep.to_numpy(zero_copy_only=False)]


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _blocks(p: Path, ent: str, e: EntityRows, metrics: list[str], unit: str,
            exact: tuple[int, ...] = ()):  # fmt: skip
    """Rows sorted by time (stable), a poll sent twice kept once: t, x (n, d), labels,
    per-row split. With ``exact`` columns (kept as float64 too), x is float64 and holds
    their exact values."""
    t = np.frombuffer(e.t, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    x = np.frombuffer(e.x, dtype=np.float32).reshape(len(t), len(metrics))
    if exact:
        x = x.astype(np.float64)
        x[:, list(exact)] = np.frombuffer(e.exact, dtype=np.float64).reshape(len(t), len(exact))
    lab = np.frombuffer(e.label, dtype=np.int8)
    tr = np.frombuffer(e.train, dtype=np.int8)
    rows = t[order], x[order], (lab[order] if lab.size else lab), tr[order]
    return _once_per_time(p, ent, metrics, unit, *rows)


def _once_per_time(p: Path, ent: str, metrics: list[str], unit: str, t, x, lab, tr):
    """A row repeating its entity's timestamp with the same values is a poll sent twice
    (an export retried) and is dropped; with other values the file is refused, since
    which reading holds cannot be told (Prometheus treats samples the same way)."""
    again = np.flatnonzero(np.diff(t) == 0) + 1  # rows at the time of the row before
    if again.size == 0:
        return t, x, lab, tr
    a, b = x[again], x[again - 1]
    same_x = (a == b) | (np.isnan(a) & np.isnan(b))
    same = same_x.all(axis=1) & (tr[again] == tr[again - 1])
    if lab.size:
        same &= lab[again] == lab[again - 1]
    if not same.all():
        i = int(np.argmin(same))
        column = metrics[int(np.argmin(same_x[i]))] if not same_x[i].all() else "label/split"
        raise CsvError(
            f"{p}: entity '{ent}': two rows at timestamp {_when(t[again[i]], unit)} differ (column "
            f"'{column}'): one row per poll, or drop the wrong one"
        )
    keep = np.ones(len(t), dtype=bool)
    keep[again] = False
    return t[keep], x[keep], (lab[keep] if lab.size else lab), tr[keep]


def _when(hours: float, unit: str) -> str:
    """A time as the file can be searched for it: its number in ``--time-unit`` with
    every digit (epoch seconds in ``%g`` lost the last four), and, for a time from 1990
    on, the UTC time it is (ISO 8601 input is read as hours since the epoch)."""
    text = f"{hours / TIME_UNITS.get(unit, 1.0):.15g}"
    if _EPOCH_1990_H <= hours < _EPOCH_9999_H:
        iso = datetime.fromtimestamp(hours * 3600.0, UTC).isoformat(timespec="seconds")
        text += f" ({iso.replace('+00:00', 'Z')})"
    return text


def _polls_apart(t: np.ndarray, step: float) -> np.ndarray:
    """Per pair of consecutive polls, how many poll intervals apart they are (1 up to
    1.5 ``step``; beyond it, the rounded count: one more than the polls missed)."""
    d = np.diff(t)
    k = np.maximum(np.rint(d / step).astype(np.int64), 1)
    k[d <= 1.5 * step] = 1
    return k


def _check_gaps(p: Path, ent: str, t: np.ndarray, k: np.ndarray, step: float, unit: str) -> None:
    """Refuse an entity whose gaps would add more missed polls than it has polls (and
    more than ``MISSED_POLLS_FREE``): one stray timestamp (a clock at 1970, epoch
    seconds read as hours) would otherwise be gigabytes of rows of NaN. ``k``: the
    polls' ``_polls_apart``."""
    if len(t) < 2:
        return
    missed = int(k.sum()) - len(k)
    if missed <= max(len(t), MISSED_POLLS_FREE):
        return
    i = int(np.argmax(k))
    raise CsvError(
        f"{p}: entity '{ent}': its gaps would add {missed:,} missed polls to its "
        f"{len(t):,} (the longest between timestamps {_when(t[i], unit)} and "
        f"{_when(t[i + 1], unit)}, "
        f"poll interval {step:g} h): is a timestamp wrong, or --time-unit or --poll-interval?"
    )


def fill_gaps(
    t: np.ndarray, x: np.ndarray, step: float, apart: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Insert a missed poll (a row of NaN) wherever consecutive polls are further apart
    than 1.5 ``step``: a dropped poll is a gap the model should see, not a shorter
    interval between two readings. ``apart``: ``_polls_apart(t, step)``, if known."""
    if len(t) < 2 or not step > 0:
        return t, x
    apart = _polls_apart(t, step) if apart is None else apart
    pos = np.concatenate([[0], np.cumsum(apart)])
    n = int(pos[-1]) + 1
    real = np.zeros(n, dtype=bool)
    real[pos] = True
    prev = np.maximum.accumulate(np.where(real, np.arange(n), 0))
    tt = np.empty(n)
    tt[pos] = t
    tt = tt[prev] + (np.arange(n) - prev) * step
    xx = np.full((n, x.shape[1]), np.nan, dtype=x.dtype)
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

    parquet = fleetparquet.is_parquet(p) if opts.parquet is None else opts.parquet
    read = fleetparquet.stream if parquet else _stream
    metrics, ents, detection = read(p, opts)
    if not ents:
        raise CsvError(f"{p}: no data rows after the header")
    if detection:
        out = _detection(p, metrics, ents, opts.time_unit)
    else:
        out = _prediction(p, metrics, ents, opts)
    out.name = f"{'parquet' if parquet else 'csv'}:{p.name}"  # as --dataset takes it
    del ents
    release_freed()  # the raw rows, freed entity by entity
    return out


def _detection(p: Path, metrics: list[str], ents: dict[str, EntityRows], unit: str) -> DetectionSet:
    name = p.name
    machines = []
    for ent, e in ents.items():
        _, x, y, tr = _blocks(p, ent, e, metrics, unit)
        if (tr >= 0).any() and -1 in e.split_row:
            raise CsvError(
                f"{p}: row {e.split_row[-1]}, column 'split': empty, while other rows of "
                f"entity '{ent}' have one; give every row of it train or test, or none"
            )
        is_train = tr == 1 if (tr >= 0).any() else np.arange(len(x)) < len(x) // 2
        if not is_train.any() or is_train.all():
            raise CsvError(
                f"{name}: entity '{ent}' has no {'test' if is_train.all() else 'train'} rows"
            )
        if is_train.sum() < MIN_TRAIN_ROWS:
            raise CsvError(
                f"{name}: entity '{ent}' has {is_train.sum()} training row(s): detection needs at least "
                f"{MIN_TRAIN_ROWS} (one to fit on, one to set the threshold)"
            )
        # Detectors train unlabelled, so missing values are filled from the column
        # median of the training part (forward-fill would need an order-aware model).
        # A metric never given in training is filled with 0 (then constant: left out
        # by the scaler), without numpy's all-NaN warning for it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nan_to_num(np.nanmedian(x[is_train], axis=0))
        x = np.where(np.isnan(x), med, x).astype(np.float32)
        machines.append(Machine(ent, x[is_train], x[~is_train], y[~is_train]))
    return DetectionSet(name, machines)


def _entity_split(p: Path, ent: str, e: EntityRows) -> str | None:
    given = {s: r for s, r in e.split_row.items() if s >= 0}
    if len(given) > 1 or (given and -1 in e.split_row):
        rows = sorted(e.split_row.values())
        raise CsvError(
            f"{p}: row {rows[1]}, column 'split': entity '{ent}' is in more than "
            f"one split (rows {rows[0]} and {rows[1]}); a module is either "
            "trained on or tested on"
        )
    return {1: "train", 0: "test"}.get(next(iter(given), -1))


def _lanes(metrics: list[str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for m in metrics:
        hit = _LANE.match(m)
        if hit:
            groups.setdefault(hit.group(1), []).append(m)
    return [
        sorted(g, key=lambda c: int(_LANE.match(c).group(2))) for g in groups.values() if len(g) > 1
    ]


def cumulative_counters(metrics: list[str], profile: str | None) -> list[str]:
    """The metrics read as cumulative counters: ``*_total``, and the generator's
    counter names under ``--profile transceiver``."""
    names = [m for m in metrics if m.endswith("_total")]
    if profile == "transceiver":
        from services.health.transceiver import NOTES

        names += [m for m in NOTES["counters"] if m in metrics]
    return names


def exact_columns(metrics: list[str], detection: bool, profile: str | None) -> tuple[int, ...]:
    """The metrics kept as float64 beside float32 while reading: a prediction set's
    cumulative counters. A byte or FEC counter runs past 2^24, where float32 moves in
    steps of 2 and more (1,024 at 1e10), and its per-poll increments would be rounded
    away; every other value is held as float32 (4 bytes)."""
    if detection:
        return ()
    return tuple(metrics.index(m) for m in cumulative_counters(metrics, profile))


def _median_spacing(ents: dict[str, EntityRows]) -> float:
    """The median interval between an entity's distinct timestamps (a poll sent twice
    is one poll; see _once_per_time); 1 when no entity has two (then nothing is a gap)."""
    gaps = [np.diff(np.unique(np.frombuffer(e.t))) for e in ents.values() if len(e.t) > 1]
    gaps = [g for g in gaps if g.size]
    return float(np.median(np.concatenate(gaps))) if gaps else 1.0


def _prediction(p: Path, metrics, ents: dict[str, EntityRows], opts: CsvOptions) -> PredictionSet:
    step = _median_spacing(ents) if opts.poll_interval is None else opts.poll_interval
    if not (step > 0 and np.isfinite(step)):
        raise CsvError(
            f"{p}: the poll interval is {step:g} h: give --poll-interval in hours, above 0"
        )
    out, split = [], {}
    exact = exact_columns(metrics, False, opts.profile)
    for ent, e in ents.items():
        t, x, _, _ = _blocks(p, ent, e, metrics, opts.time_unit, exact)
        f = e.failure[0]
        keep = ~(t >= f) if np.isfinite(f) else np.ones(len(t), bool)  # the dead module
        if not keep.any():
            raise CsvError(
                f"{p}: row {e.failure[1]}, column 'failure_time': entity '{ent}' failed at or "
                "before its first poll, so none of its rows comes before the failure"
            )
        t, x = t[keep], x[keep]
        apart = _polls_apart(t, step)  # once, for the check and the filling
        _check_gaps(p, ent, t, apart, step, opts.time_unit)
        t, x = fill_gaps(t, x, step, apart)
        kept = {c: x[:, c].copy() for c in exact}  # copies: x itself is not held
        out.append(Entity(ent, t, x.astype(np.float32), f,
                          "failing" if np.isfinite(f) else "healthy", exact=kept))  # fmt: skip
        split[ent] = _entity_split(p, ent, e)
        # The raw rows are copied into the entity: free them now, so a large export
        # is held once, not twice, at the peak.
        e.t, e.x, e.exact = array("d"), array("f"), array("d")
        e.label, e.train = array("b"), array("b")
    if any(s is None for s in split.values()):
        if any(s is not None for s in split.values()):
            raise CsvError(f"{p}: column 'split': given for some entities and not others")
        order = np.random.default_rng(opts.seed).permutation(len(out))
        cut = int(round(0.7 * len(out)))
        split = {out[i].name: ("train" if k < cut else "test") for k, i in enumerate(order)}
    notes = {"counters": cumulative_counters(metrics, opts.profile),
             "deltas": [m for m in metrics if m.endswith("_delta")]}  # fmt: skip
    if opts.profile == "transceiver":
        notes.update(profile="transceiver", lanes=_lanes(metrics))
    return PredictionSet(
        name=p.name,
        channels=metrics,
        train=[e for e in out if split[e.name] == "train"],
        test=[e for e in out if split[e.name] == "test"],
        horizon=opts.horizon,
        time_unit="hours",
        step=step,
        notes=notes,
    )
