"""Fleet telemetry from a Parquet export: the CSV schema (``fleetcsv.SCHEMA``), read
in record batches.

A batch (``BATCH_ROWS`` rows) is converted column by column with pyarrow and numpy,
then appended to the same per-entity typed arrays the CSV reader fills, so memory is
one batch plus the data's numbers, and everything after reading (time order, gaps,
splits, failure times, profiles) is the CSV path's code.

Column types: ``entity`` any type (as text); ``timestamp`` and ``failure_time`` a
number in --time-unit, an Arrow timestamp or date, or ISO 8601 text; metrics any
numeric or boolean type, or text holding numbers; ``label`` 0/1 (integer, boolean
or text); ``split`` text. Null is missing, as an empty CSV cell is. Every bad input
is a ``CsvError`` naming the row and the column. Rows are numbered as in a CSV with
a header: the first data row is row 2, so a file converted from CSV names the same
rows.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import numpy as np

from services.health import fleetcsv
from services.health.fleetcsv import CsvError, CsvOptions, _Rows

BATCH_ROWS = 65_536
SUFFIXES = (".parquet", ".pq")
FIRST_ROW = 2  # as the CSV reader counts: the header is row 1


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES


def stream(path: Path, opts: CsvOptions):
    """(metrics, per-entity rows, is detection) like ``fleetcsv._stream``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    unit = fleetcsv.TIME_UNITS.get(opts.time_unit)
    if unit is None:
        raise CsvError(f"--time-unit {opts.time_unit!r}: one of {', '.join(fleetcsv.TIME_UNITS)}")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise CsvError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    header = _header(path, pf.schema_arrow.names)
    metrics = [c for c in header if c not in fleetcsv.RESERVED]
    detection = "label" in header
    progress = fleetcsv._Progress(path, opts.progress)
    total = max(pf.metadata.num_rows, 1)
    ents: dict[str, _Rows] = {}
    row = FIRST_ROW
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS):
            _add_batch(ents, batch, row, metrics, detection, unit, path)
            row += batch.num_rows
            progress.advance(int(progress.total * batch.num_rows / total))
    except pa.ArrowException as exc:
        raise CsvError(f"{path}: Parquet data near row {row} cannot be read "
                       f"({_first_line(exc)})") from None  # fmt: skip
    return metrics, ents, detection


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _header(path: Path, names: list[str]) -> list[str]:
    for col in ("entity", "timestamp"):
        if col not in names:
            raise CsvError(f"{path}: schema: missing column '{col}' (schema: "
                           "stalwart health eval --help)")  # fmt: skip
    if ("label" in names) == ("failure_time" in names):
        raise CsvError(f"{path}: schema: need exactly one of the columns 'label' "
                       "(detection) or 'failure_time' (prediction)")  # fmt: skip
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise CsvError(f"{path}: schema: column '{dup[0]}' appears twice")
    return list(names)


# --- one batch ------------------------------------------------------------------------


def _add_batch(ents, batch, row0, metrics, detection, unit, path) -> None:
    n = batch.num_rows
    col = {name: batch.column(name) for name in batch.schema.names}
    names = _entities(col["entity"], row0, path)
    t = _times(col["timestamp"], "timestamp", unit, row0, path, allow_null=False)
    x = np.empty((n, len(metrics)), dtype=np.float32)
    for j, m in enumerate(metrics):
        x[:, j] = _numbers(col[m], m, row0, path)
    if detection:
        labels = _labels(col["label"], row0, path)
    else:
        failure = _times(col["failure_time"], "failure_time", unit, row0, path, allow_null=True)
    splits = _splits(col["split"], row0, path) if "split" in col else np.full(n, -1, np.int8)
    uniq, first, inverse, counts = np.unique(
        names, return_index=True, return_inverse=True, return_counts=True
    )
    by_entity = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    for k in np.argsort(first):  # entities in order of first appearance, as the CSV reader
        idx = by_entity[k]  # this entity's rows in the batch, in file order
        name = str(uniq[k])
        e = ents.get(name) or ents.setdefault(name, _Rows())
        e.t.frombytes(t[idx].tobytes())
        e.x.frombytes(np.ascontiguousarray(x[idx]).tobytes())
        if detection:
            e.label.frombytes(labels[idx].tobytes())
        else:
            _failure(e, failure[idx], idx, row0, col["failure_time"], path)
        _split_rows(e, splits[idx], idx + row0)


def _cells(array, rows: np.ndarray) -> list:
    """The raw cells of ``rows`` (batch positions), for error messages."""
    return array.take(rows).to_pylist()


def _entities(array, row0: int, path) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    text = array if pa.types.is_string(array.type) else pc.cast(array, pa.string())
    values = np.array(
        [v.strip() if v is not None else "" for v in text.to_pylist()], dtype=object
    )  # fmt: skip
    empty = np.flatnonzero(values == "")
    if empty.size:
        raise CsvError(f"{path}: row {row0 + empty[0]}, column 'entity': empty")
    return values.astype(str)


def _numbers(array, name: str, row0: int, path) -> np.ndarray:
    """float64 values, NaN for null; text must hold numbers (empty, nan, NA: missing)."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_null(kind):  # a column with nothing in it: every value missing
        return np.full(len(array), np.nan)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return _float_array(array)
    if pa.types.is_decimal(kind):
        return _float_array(array.cast(pa.float64()))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _parse_text(array.to_pylist(), name, row0, path)
    raise CsvError(f"{path}: row {row0}, column '{name}': Parquet type {kind} is not a number")


def _float_array(array) -> np.ndarray:
    import pyarrow as pa

    values = array.cast(pa.float64()).fill_null(float("nan"))
    return values.to_numpy(zero_copy_only=False)


def _parse_text(cells: list, name: str, row0: int, path) -> np.ndarray:
    out = np.empty(len(cells), dtype=np.float64)
    for i, v in enumerate(cells):
        s = "" if v is None else v.strip()
        try:
            out[i] = float("nan") if s in fleetcsv._MISSING else float(s)
        except ValueError:
            raise fleetcsv._bad(path, row0 + i, name, s, "a number (empty = missing)") from None
    return out


def _times(array, name: str, unit: float, row0: int, path, allow_null: bool) -> np.ndarray:
    """Hours since the epoch (numbers: as given, times ``unit`` hours); NaN for null."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_null(kind):
        hours = np.full(len(array), np.nan)
    elif pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        ns = array.cast(pa.timestamp("ns", tz=kind.tz if pa.types.is_timestamp(kind) else None))
        values = ns.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 3.6e12
        valid = ~np.asarray(array.is_null().to_numpy(zero_copy_only=False))
        hours = np.where(valid, values, np.nan)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        hours = _parse_time_text(array.to_pylist(), name, unit, row0, path)
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        hours = _float_array(array) * unit
    else:
        raise CsvError(f"{path}: row {row0}, column '{name}': Parquet type {kind} is not "
                       "a time")  # fmt: skip
    missing = np.flatnonzero(np.isnan(hours))
    if missing.size and not allow_null:
        i = missing[0]
        raise fleetcsv._bad(path, row0 + i, name, _cells(array, np.array([i]))[0],
                            "a number or an ISO 8601 time")  # fmt: skip
    return hours


def _parse_time_text(cells: list, name: str, unit: float, row0: int, path) -> np.ndarray:
    out = np.empty(len(cells), dtype=np.float64)
    for i, v in enumerate(cells):
        s = "" if v is None else v.strip()
        try:
            out[i] = float("nan") if s in fleetcsv._MISSING else fleetcsv.parse_time(s, unit)
        except ValueError:
            what = "a number or an ISO 8601 time"
            raise fleetcsv._bad(path, row0 + i, name, s, what) from None
    return out


def _labels(array, row0: int, path) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        cells = ["" if v is None else v.strip() for v in array.to_pylist()]
        bad = [i for i, v in enumerate(cells) if v not in ("0", "1", "")]
        if bad:
            raise fleetcsv._bad(path, row0 + bad[0], "label", cells[bad[0]], "0 or 1")
        return np.array([v == "1" for v in cells], dtype=np.int8)
    values = _numbers(array, "label", row0, path)
    bad = np.flatnonzero(~(np.isnan(values) | (values == 0) | (values == 1)))
    if bad.size:
        raise fleetcsv._bad(path, row0 + bad[0], "label", _cells(array, bad[:1])[0], "0 or 1")
    return (values == 1).astype(np.int8)


def _splits(array, row0: int, path) -> np.ndarray:
    cells = ["" if v is None else str(v).strip().lower() for v in array.to_pylist()]
    codes = {"": -1, "train": 1, "test": 0}
    for i, v in enumerate(cells):
        if v not in codes:
            raise fleetcsv._bad(path, row0 + i, "split", v, "train or test")
    return np.array([codes[v] for v in cells], dtype=np.int8)


def _failure(e: _Rows, values: np.ndarray, idx: np.ndarray, row0: int, array, path) -> None:
    """The entity's failure time must be the same on every row (NaN: never failed)."""
    if e.failure is None:
        e.failure = (float(values[0]), int(idx[0]) + row0)
    want = e.failure[0]
    same = np.isnan(values) if np.isnan(want) else values == want
    if not same.all():
        i = int(idx[np.flatnonzero(~same)[0]])
        cell = _text(_cells(array, np.array([i]))[0])
        raise CsvError(f"{path}: row {row0 + i}, column 'failure_time': {cell!r} "
                       f"differs from the entity's failure time on row {e.failure[1]}")  # fmt: skip


def _text(cell) -> str:
    if cell is None:
        return ""
    if hasattr(cell, "isoformat"):
        return cell.astimezone(UTC).isoformat() if getattr(cell, "tzinfo", None) else str(cell)
    return str(cell)


def _split_rows(e: _Rows, codes: np.ndarray, rows: np.ndarray) -> None:
    e.train.frombytes(codes.tobytes())
    for code in np.unique(codes):
        e.split_row.setdefault(int(code), int(rows[np.flatnonzero(codes == code)[0]]))
