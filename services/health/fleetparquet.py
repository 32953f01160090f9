"""Fleet telemetry from a Parquet export: the CSV schema (``fleetcsv.SCHEMA``), read
in record batches.

A batch (``BATCH_ROWS`` rows) goes through ``fleetbatch.add_batch``, as a CSV file's
batches do: checked and converted column by column, then appended to the per-entity
typed arrays, so memory is one batch plus the data's numbers, and everything after
reading (time order, gaps, splits, failure times, profiles) is the CSV path's code.

Column types: ``entity`` any type (as text); ``timestamp`` and ``failure_time`` a
number in --time-unit, an Arrow timestamp or date, or ISO 8601 text; metrics any
numeric or boolean type, or text holding numbers; ``label`` 0/1 (integer, boolean
or text); ``split`` text. Null is missing, as an empty CSV cell is. Every bad input
is a ``CsvError`` naming the row and the column. Rows are numbered as in a CSV with
a header: the first data row is row 2, so a file converted from CSV names the same
rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.health import fleetcsv
from services.health.fleetbatch import CsvError, EntityRows
from services.health.fleetcsv import CsvOptions

BATCH_ROWS = 65_536
SUFFIXES = (".parquet", ".pq")
FIRST_ROW = 2  # as the CSV reader counts: the header is row 1


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES


def stream(path: Path, opts: CsvOptions):
    """(metrics, per-entity rows, is detection) like ``fleetcsv._stream``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from services.health.fleetbatch import add_batch

    unit = fleetcsv.TIME_UNITS.get(opts.time_unit)
    if unit is None:
        raise CsvError(f"--time-unit {opts.time_unit!r}: one of {', '.join(fleetcsv.TIME_UNITS)}")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise CsvError(f"{path}: not a readable Parquet file ({_first_line(exc)})") from None
    header = fleetcsv.check_header(path, pf.schema_arrow.names, "schema")
    metrics = [c for c in header if c not in fleetcsv.RESERVED]
    detection = "label" in header
    exact = fleetcsv.exact_columns(metrics, detection, opts.profile)
    progress = fleetcsv._Progress(path, opts.progress)
    total = max(pf.metadata.num_rows, 1)
    ents: dict[str, EntityRows] = {}
    row = FIRST_ROW
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS):
            rows = np.arange(row, row + batch.num_rows)
            add_batch(ents, batch, rows, metrics, detection, unit, path, exact)
            row += batch.num_rows
            progress.advance(int(progress.total * batch.num_rows / total))
    except pa.ArrowException as exc:
        raise CsvError(f"{path}: Parquet data near row {row} cannot be read "
                       f"({_first_line(exc)})") from None  # fmt: skip
    return metrics, ents, detection


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
