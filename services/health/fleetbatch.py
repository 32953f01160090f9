"""One Arrow record batch of a fleet export (``fleetcsv.SCHEMA``), checked and appended
to the per-entity typed arrays: the one code path for CSV and Parquet.

Columns are converted whole with pyarrow's compute functions: text holding numbers is
trimmed, the missing markers become null, and the column is cast to float64 in C++.
Only where that cast fails is the column parsed cell by cell in Python, which either
accepts what Python's ``float`` accepts (the CSV reader's rules before it read through
Arrow) or names the first bad cell. ``rows`` gives each batch position's row in the
file (header = row 1), so every message names the row a person finds in an editor.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MISSING = ("", "nan", "NaN", "NA")  # cells read as a missing value
FLOAT32_MAX = float(np.finfo(np.float32).max)
_TIME = "a number or an ISO 8601 time"
_TEXT = (pa.types.is_string, pa.types.is_large_string)


class CsvError(ValueError):
    """A fleet file that does not follow ``fleetcsv.SCHEMA``; the message is one line."""


@dataclass
class EntityRows:
    """One entity's rows as typed arrays, in file order."""

    t: array = field(default_factory=lambda: array("d"))
    x: array = field(default_factory=lambda: array("f"))  # row-major, d values a row
    exact: array = field(default_factory=lambda: array("d"))  # the exact columns, as x
    label: array = field(default_factory=lambda: array("b"))
    train: array = field(default_factory=lambda: array("b"))  # per row: 1 train, 0 test, -1 none
    failure: tuple[float, int] | None = None  # (time, first row giving it)
    split_row: dict[int, int] = field(default_factory=dict)  # split value -> first row


def parse_time(value: str, unit: float) -> float:
    """ISO 8601 or a number in ``unit`` hours -> hours since the epoch (numbers: as given)."""
    try:
        return float(value) * unit
    except ValueError:
        text = value.strip()
        if text.endswith("z"):  # RFC 3339 allows a lowercase Z, fromisoformat does not
            text = text[:-1] + "Z"
        dt = datetime.fromisoformat(text)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp() / 3600.0


def bad_cell(path, row, name, value, what) -> CsvError:
    return CsvError(f"{path}: row {row}, column '{name}': {value!r} is not {what}")


def add_batch(ents: dict[str, EntityRows], batch, rows: np.ndarray, metrics: list[str],
              detection: bool, unit: float, path, exact: tuple[int, ...] = ()) -> None:  # fmt: skip
    """Check ``batch`` and append its rows to ``ents``, entity by entity in order of first
    appearance (the order the evaluation lists entities in). ``exact``: the metrics
    (by index) also kept as float64, where float32 would lose their units."""
    if batch.num_rows == 0:
        return
    col = {name: _decoded(batch.column(name)) for name in batch.schema.names}
    codes, names = _entities(col["entity"], rows, path)
    t = _times(col["timestamp"], "timestamp", unit, rows, path, allow_null=False)
    x = np.empty((batch.num_rows, len(metrics)), dtype=np.float32)
    x64 = np.empty((batch.num_rows, len(exact)), dtype=np.float64)
    for j, m in enumerate(metrics):
        values = _numbers(col[m], m, rows, path)
        _check_float32(values, col[m], m, rows, path)
        x[:, j] = values
        if j in exact:
            x64[:, exact.index(j)] = values
    if detection:
        labels = _labels(col["label"], rows, path)
    else:
        failure = _times(col["failure_time"], "failure_time", unit, rows, path, allow_null=True)
    n = batch.num_rows
    splits = _splits(col["split"], rows, path) if "split" in col else np.full(n, -1, np.int8)
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(names)))[:-1]
    for name, idx in zip(names, np.split(order, bounds), strict=True):
        e = ents.get(name) or ents.setdefault(name, EntityRows())  # idx: its rows, in file order
        e.t.frombytes(t[idx].tobytes())
        e.x.frombytes(np.ascontiguousarray(x[idx]).tobytes())
        e.exact.frombytes(np.ascontiguousarray(x64[idx]).tobytes())
        if detection:
            e.label.frombytes(labels[idx].tobytes())
        else:
            _failure(e, failure[idx], idx, rows, col["failure_time"], path)
        _split_rows(e, splits[idx], rows[idx])


def _decoded(array):
    """A dictionary-encoded column (a pandas categorical, pyarrow's dictionary) as its
    plain values, so each type is checked and converted the one way."""
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _check_float32(values: np.ndarray, array, name: str, rows: np.ndarray, path) -> None:
    """Metric values are held as float32 (4 bytes a value): one beyond its range would
    become infinite there, which no scaler can centre."""
    beyond = np.flatnonzero(np.abs(values) > FLOAT32_MAX)
    if beyond.size:
        i = int(beyond[0])
        raise bad_cell(path, rows[i], name, _text(_cell(array, i)),
                       f"within float32's range (at most {FLOAT32_MAX:.4g} in magnitude)")  # fmt: skip


def _is_text(array) -> bool:
    return any(is_kind(array.type) for is_kind in _TEXT)


def _trimmed_text(array):
    """The column as trimmed text; null stays null."""
    text = array if _is_text(array) else pc.cast(array, pa.string())
    return pc.utf8_trim_whitespace(text)


def _first(mask) -> int | None:
    hit = np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False)))
    return int(hit[0]) if hit.size else None


def _cell(array, i: int):
    return array[i].as_py()


def _entities(array, rows: np.ndarray, path) -> tuple[np.ndarray, list[str]]:
    """Per row the index of its entity, and the entity names in order of first appearance."""
    text = _trimmed_text(array)
    empty = _first(pc.fill_null(pc.equal(text, ""), True))
    if empty is not None:
        raise CsvError(f"{path}: row {rows[empty]}, column 'entity': empty")
    encoded = pc.dictionary_encode(text)
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def _numbers(array, name: str, rows: np.ndarray, path) -> np.ndarray:
    """float64 values, NaN for null; text must hold numbers (empty, nan, NA: missing),
    and no value may be infinite (a scaler cannot centre it, nor a detector score it)."""
    values = _any_numbers(array, name, rows, path)
    infinite = np.flatnonzero(np.isinf(values))
    if infinite.size:
        i = int(infinite[0])
        raise bad_cell(path, rows[i], name, _text(_cell(array, i)),
                       "a finite number (empty = missing)")  # fmt: skip
    return values


def _any_numbers(array, name: str, rows: np.ndarray, path) -> np.ndarray:
    kind = array.type
    if pa.types.is_null(kind):  # a column with nothing in it: every value missing
        return np.full(len(array), np.nan)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return _float_array(array)
    if pa.types.is_decimal(kind):
        return _float_array(array.cast(pa.float64()))
    if _is_text(array):
        fast = _text_floats(array)
        return (
            fast
            if fast is not None
            else _parse_cells(array, name, rows, path, float, "a number (empty = missing)")
        )
    raise CsvError(f"{path}: row {rows[0]}, column '{name}': Parquet type {kind} is not "
                   "a number")  # fmt: skip


def _float_array(array) -> np.ndarray:
    values = array.cast(pa.float64()).fill_null(float("nan"))
    return values.to_numpy(zero_copy_only=False)


def _text_floats(array) -> np.ndarray | None:
    """Text cast to float64 in C++ (missing markers: NaN); None when some cell is not
    a number Arrow reads, for the cell-by-cell path to decide."""
    text = pc.utf8_trim_whitespace(array)
    markers = pa.array(MISSING, type=text.type)
    missing = pc.fill_null(pc.is_in(text, value_set=markers), True)
    try:
        return _float_array(pc.if_else(missing, pa.scalar(None, text.type), text))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _parse_cells(array, name: str, rows: np.ndarray, path, parse, what: str) -> np.ndarray:
    """Each trimmed cell through ``parse`` (a missing marker: NaN); the first one it
    refuses is named by its row."""
    cells = array.to_pylist()
    out = np.empty(len(cells), dtype=np.float64)
    for i, v in enumerate(cells):
        s = "" if v is None else v.strip()
        try:
            out[i] = float("nan") if s in MISSING else parse(s)
        except ValueError:
            raise bad_cell(path, rows[i], name, s, what) from None
    return out


def _times(array, name: str, unit: float, rows: np.ndarray, path, allow_null: bool) -> np.ndarray:
    """Hours since the epoch (numbers: as given, times ``unit`` hours); NaN for null."""
    kind = array.type
    what = f"empty, {_TIME}" if allow_null else _TIME
    if pa.types.is_null(kind):
        hours = np.full(len(array), np.nan)
    elif pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        # microseconds: nanoseconds end in 2262, and "9999-12-31" is a common "never"
        us = array.cast(pa.timestamp("us", tz=kind.tz if pa.types.is_timestamp(kind) else None))
        values = us.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 3.6e9
        valid = ~np.asarray(array.is_null().to_numpy(zero_copy_only=False))
        hours = np.where(valid, values, np.nan)
    elif _is_text(array):
        fast = _text_floats(array)
        if fast is not None:
            hours = fast * unit
        else:
            hours = _parse_cells(array, name, rows, path, lambda s: parse_time(s, unit), what)
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        hours = _float_array(array) * unit
    else:
        raise CsvError(f"{path}: row {rows[0]}, column '{name}': Parquet type {kind} is not "
                       "a time")  # fmt: skip
    missing = np.flatnonzero(np.isnan(hours))
    if missing.size and not allow_null:
        i = int(missing[0])
        raise bad_cell(path, rows[i], name, _strip(_cell(array, i)), what)
    return hours


def _strip(cell):
    return cell.strip() if isinstance(cell, str) else cell


def _coded(array, allowed: list[str], name: str, rows: np.ndarray, path, what: str,
           lower: bool = False) -> np.ndarray:  # fmt: skip
    """Per row the position of its trimmed text in ``allowed`` (null = "")."""
    text = pc.fill_null(_trimmed_text(array), "")
    if lower:
        text = pc.utf8_lower(text)
    pos = pc.index_in(text, value_set=pa.array(allowed, type=text.type))
    bad = _first(pc.is_null(pos))
    if bad is not None:
        raise bad_cell(path, rows[bad], name, _cell(text, bad), what)
    return pos.to_numpy(zero_copy_only=False)


def _labels(array, rows: np.ndarray, path) -> np.ndarray:
    if _is_text(array):
        pos = _coded(array, ["", "0", "1", "0.0", "1.0"], "label", rows, path, "0 or 1")
        return ((pos == 2) | (pos == 4)).astype(np.int8)  # 1.0: pandas' float labels
    values = _numbers(array, "label", rows, path)
    bad = np.flatnonzero(~(np.isnan(values) | (values == 0) | (values == 1)))
    if bad.size:
        raise bad_cell(path, rows[bad[0]], "label", _cell(array, int(bad[0])), "0 or 1")
    return (values == 1).astype(np.int8)


def _splits(array, rows: np.ndarray, path) -> np.ndarray:
    pos = _coded(array, ["", "train", "test"], "split", rows, path, "train or test", lower=True)
    return np.array([-1, 1, 0], dtype=np.int8)[pos]


def _failure(e: EntityRows, values: np.ndarray, idx: np.ndarray, rows: np.ndarray, array,
             path) -> None:  # fmt: skip
    """The entity's failure time must be the same on every row (NaN: never failed)."""
    if e.failure is None:
        e.failure = (float(values[0]), int(rows[idx[0]]))
    want = e.failure[0]
    same = np.isnan(values) if np.isnan(want) else values == want
    if not same.all():
        i = int(idx[np.flatnonzero(~same)[0]])
        cell = _text(_cell(array, i))
        raise CsvError(f"{path}: row {rows[i]}, column 'failure_time': {cell!r} "
                       f"differs from the entity's failure time on row {e.failure[1]}")  # fmt: skip


def _text(cell) -> str:
    if cell is None:
        return ""
    if hasattr(cell, "isoformat"):
        return cell.astimezone(UTC).isoformat() if getattr(cell, "tzinfo", None) else str(cell)
    return str(cell).strip()


def _split_rows(e: EntityRows, codes: np.ndarray, rows: np.ndarray) -> None:
    e.train.frombytes(codes.tobytes())
    for code in np.unique(codes):
        e.split_row.setdefault(int(code), int(rows[np.flatnonzero(codes == code)[0]]))
