"""Memory and time of fleet CSV ingestion on a transceiver export of a given size.

    python scripts/health_csv_memory.py write PATH MB   # an export of about MB MiB
    python scripts/health_csv_memory.py parquet CSV OUT # the same rows as Parquet
    python scripts/health_csv_memory.py read PATH       # ingest it; print time and max RSS

The export repeats 200 generated modules (seed 99) under new entity names until it
reaches the size; each copy keeps its module's split. Run ``read`` in its own process,
so the maximum RSS is the ingestion's alone.
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np

from services.health import fleetcsv, transceiver


def write(path: str, mib: float) -> None:
    cols = list(transceiver.CHANNELS)
    lines = []
    for k, e in enumerate(transceiver.generate(200, 99, prefix="m")):
        f = f"{e.failure_time:.2f}" if np.isfinite(e.failure_time) else ""
        split = "train" if k % 10 < 7 else "test"
        for t, row in zip(e.t, e.x, strict=True):
            vals = ",".join("" if np.isnan(v) else f"{v:.4g}" for v in row)
            lines.append((e.name, f",{t:.2f},{vals},{f},{split}\n"))
    with open(path, "w") as fh:
        fh.write("entity,timestamp," + ",".join(cols) + ",failure_time,split\n")
        rep = 0
        while fh.tell() < mib * 2**20:
            fh.writelines(f"{name}-{rep}{rest}" for name, rest in lines)
            rep += 1


def to_parquet(csv_path: str, out: str) -> None:
    """The CSV's rows as Parquet, converted block by block (bounded memory): entity and
    split as text, every other column float64 (empty cells become nulls)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    with open(csv_path) as fh:
        names = fh.readline().strip().split(",")
    types = {n: (pa.string() if n in ("entity", "split") else pa.float64()) for n in names}
    reader = pacsv.open_csv(
        csv_path,
        convert_options=pacsv.ConvertOptions(column_types=types),
        read_options=pacsv.ReadOptions(block_size=16 << 20),
    )
    with pq.ParquetWriter(out, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch, row_group_size=256 * 1024)


def read(path: str) -> None:
    t0 = time.time()
    ds = fleetcsv.load(path, fleetcsv.CsvOptions(profile="transceiver"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{len(ds.train) + len(ds.test)} entities in {time.time() - t0:.0f} s, "
        f"max RSS {rss:.0f} MiB"
    )


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "parquet":
        to_parquet(sys.argv[2], sys.argv[3])
    else:
        read(sys.argv[2])
