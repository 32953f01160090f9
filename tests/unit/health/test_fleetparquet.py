"""Fleet exports in Parquet: the CSV schema, read in record batches. The same data reads
the same as from CSV (whatever the batch size), Arrow types (timestamps, integers,
nulls, text) are understood, and every bad input is one `Error: ...` line naming the
row and the column, with exit code 2."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.health import eval as health_eval
from services.health import fleetcsv, fleetparquet

pytestmark = pytest.mark.timeout(120)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _parquet(tmp_path, columns: dict, name="fleet.parquet", row_group_size=None):
    p = tmp_path / name
    pq.write_table(pa.table(columns), p, row_group_size=row_group_size)
    return p


def _refused(capsys, path):
    rc = health_eval.main(["--dataset", f"parquet:{path}", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("Error: ")
    return err[0]


def _fleet_rows(n_entities=6, polls=40):
    """Prediction rows: half the entities fail after their last poll, one poll dropped."""
    rows = []
    for k in range(n_entities):
        fails = k % 2 == 0
        for i in range(polls):
            if k == 1 and i == 7:
                continue  # a dropped poll: a gap to be filled
            temp = 40.0 + 0.1 * i * fails + k
            rows.append((f"m{k}", i * 0.25, temp, None if i == 3 else 10.0 * i,
                         polls * 0.25 if fails else None, "train" if k < 4 else "test"))  # fmt: skip
    return rows


def _as_csv(tmp_path, rows):
    lines = ["entity,timestamp,temp,fec_total,failure_time,split"]
    for e, t, temp, fec, ft, split in rows:
        lines.append(f"{e},{t},{temp},{'' if fec is None else fec},{'' if ft is None else ft},"
                     f"{split}")  # fmt: skip
    p = tmp_path / "fleet.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def _as_parquet(tmp_path, rows, **kw):
    names = ["entity", "timestamp", "temp", "fec_total", "failure_time", "split"]
    return _parquet(tmp_path, {n: [r[i] for r in rows] for i, n in enumerate(names)}, **kw)


def _same(a, b):
    assert a.channels == b.channels and a.step == b.step and a.notes == b.notes
    for ea, eb in zip(a.train + a.test, b.train + b.test, strict=True):
        assert ea.name == eb.name and ea.kind == eb.kind
        np.testing.assert_array_equal(ea.t, eb.t)
        np.testing.assert_array_equal(ea.x, eb.x)
        assert ea.failure_time == eb.failure_time or (
            np.isnan(ea.failure_time) and np.isnan(eb.failure_time)
        )


@pytest.mark.parametrize("batch_rows", [7, 65_536])
def test_parquet_reads_as_the_same_csv_does(tmp_path, monkeypatch, batch_rows):
    monkeypatch.setattr(fleetparquet, "BATCH_ROWS", batch_rows)  # entities across batches
    rows = _fleet_rows()
    opts = fleetcsv.CsvOptions(progress=False)
    from_csv = fleetcsv.load(str(_as_csv(tmp_path, rows)), opts)
    from_pq = fleetcsv.load(str(_as_parquet(tmp_path, rows, row_group_size=50)), opts)
    _same(from_csv, from_pq)
    assert [e.name for e in from_pq.train] == ["m0", "m1", "m2", "m3"]
    gap = from_pq.train[1]
    assert len(gap.t) == 40 and np.isnan(gap.x[7]).all()  # the dropped poll came back


def test_no_split_column_draws_the_same_split_as_csv(tmp_path):
    rows = [r[:5] + ("",) for r in _fleet_rows(10, 8)]
    opts = fleetcsv.CsvOptions(progress=False)
    a = fleetcsv.load(str(_as_csv(tmp_path, rows)), opts)
    no_split = [r[:5] for r in rows]
    names = ["entity", "timestamp", "temp", "fec_total", "failure_time"]
    p = _parquet(tmp_path, {n: [r[i] for r in no_split] for i, n in enumerate(names)})
    b = fleetcsv.load(str(p), opts)
    assert [e.name for e in a.test] == [e.name for e in b.test]  # entity order kept
    _same(a, b)


def test_arrow_timestamps_integers_and_text_numbers(tmp_path):
    ts = [T0 + timedelta(hours=h) for h in range(4)]
    p = _parquet(tmp_path, {
        "entity": pa.array([7, 7, 8, 8], pa.int64()),  # integer ids are names too
        "timestamp": pa.array(ts, pa.timestamp("ms", tz="UTC")),
        "temp": pa.array([40, 41, None, 43], pa.int32()),
        "volts": pa.array(["3.3", "", "nan", "3.1"]),
        "failure_time": pa.array([ts[3] + timedelta(hours=1)] * 2 + [None] * 2,
                                 pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(poll_interval=1.0, progress=False))
    ents = {e.name: e for e in ds.train + ds.test}
    assert set(ents) == {"7", "8"}
    hours = T0.timestamp() / 3600
    np.testing.assert_allclose(ents["7"].t, [hours, hours + 1])
    assert ents["7"].failure_time == pytest.approx(hours + 4)
    assert np.isnan(ents["8"].failure_time)
    np.testing.assert_allclose(ents["8"].x[:, 0], [np.nan, 43], equal_nan=True)
    np.testing.assert_allclose(ents["7"].x[:, 1], [3.3, np.nan], rtol=1e-6, equal_nan=True)


def test_detection_parquet_with_boolean_labels(tmp_path):
    n = 40
    p = _parquet(tmp_path, {
        "entity": ["n1"] * n,
        "timestamp": list(range(n)),
        "cpu": [float(i % 5) for i in range(n)],
        "label": pa.array([i == 30 for i in range(n)], pa.bool_()),
    })  # fmt: skip
    (m,) = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False)).machines
    assert len(m.train) == 20 and m.labels.tolist() == [int(i == 30) for i in range(20, n)]


def _good(**override):
    cols = {"entity": ["m1", "m1", "m2"], "timestamp": [0.0, 1.0, 0.0], "temp": [40.0, 41.0, 40.0],
            "failure_time": [None, None, None]}  # fmt: skip
    cols.update(override)
    return {k: v for k, v in cols.items() if v is not None}


@pytest.mark.parametrize(
    "columns, says",
    [
        (_good(entity=None), "schema: missing column 'entity'"),
        (_good(timestamp=None), "schema: missing column 'timestamp'"),
        (_good(failure_time=None), "need exactly one of the columns 'label'"),
        (_good(label=[0, 0, 1]), "need exactly one of the columns 'label'"),
        (_good(temp=["40", "hot", "40"]), "row 3, column 'temp': 'hot' is not a number"),
        (_good(temp=pa.array([[1.0], [2.0], [3.0]])), "row 2, column 'temp': Parquet type"),
        (_good(temp=[40.0, float("inf"), 40.0]), "row 3, column 'temp': 'inf' is not a finite"),
        (_good(temp=["40", "-inf", "40"]), "row 3, column 'temp': '-inf' is not a finite"),
        ({"entity": ["n"] * 3, "timestamp": [0, 1, 2], "label": [0, 1, 0]},
         "schema: no metric column"),
        (_good(timestamp=["0", "1", "soon"]), "row 4, column 'timestamp': 'soon' is not a number"),
        (_good(timestamp=[0.0, None, 1.0]), "row 3, column 'timestamp': None is not a number"),
        (_good(failure_time=["", "tomorrow", ""]), "row 3, column 'failure_time': 'tomorrow'"),
        (_good(failure_time=[5.0, 6.0, None]),
         "row 3, column 'failure_time': '6.0' differs from the entity's failure time on row 2"),
        (_good(entity=["m1", None, "m2"]), "row 3, column 'entity': empty"),
        (_good(entity=["m1", " ", "m2"]), "row 3, column 'entity': empty"),
        (_good(split=["train", "later", "test"]), "row 3, column 'split': 'later' is not train"),
        (_good(split=["train", "test", "test"]),
         "row 3, column 'split': entity 'm1' is in more than one split (rows 2 and 3)"),
        (_good(split=["train", "train", None]), "column 'split': given for some entities"),
        ({"entity": ["n"] * 3, "timestamp": [0, 1, 2], "cpu": [1.0] * 3, "label": [0, 2, 0]},
         "row 3, column 'label': 2 is not 0 or 1"),
        ({"entity": ["n"] * 3, "timestamp": [0, 1, 2], "cpu": [1.0] * 3,
          "label": ["0", "x", "0"]}, "row 3, column 'label': 'x' is not 0 or 1"),
        ({"entity": pa.array([], pa.string()), "timestamp": pa.array([], pa.float64()),
          "temp": pa.array([], pa.float64()), "failure_time": pa.array([], pa.float64())},
         "no data rows"),
        (_good(temp=[40.0, 1e300, 40.0]), "row 3, column 'temp': '1e+300' is not within float32"),
        ({**_good(), "__index_level_0__": [0, 1, 2]},
         "column 5 '__index_level_0__' is pandas' index: write the file with index=False"),
    ],
)  # fmt: skip
def test_bad_parquet_is_one_line_naming_row_and_column(tmp_path, capsys, columns, says):
    p = _parquet(tmp_path, columns)
    line = _refused(capsys, p)
    assert says in line, line
    assert line.startswith(f"Error: {p}") or "no data rows" in line


def test_a_bad_row_in_a_later_batch_is_named_by_its_file_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fleetparquet, "BATCH_ROWS", 4)
    temps = ["40"] * 9 + ["warm"]
    p = _parquet(tmp_path, {"entity": ["m1"] * 10, "timestamp": [float(i) for i in range(10)],
                            "temp": temps, "failure_time": [None] * 10})  # fmt: skip
    assert "row 11, column 'temp': 'warm'" in _refused(capsys, p)


def test_a_file_that_is_not_parquet_and_a_missing_one(tmp_path, capsys):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"entity,timestamp\nm1,0\n")
    assert "not a readable Parquet file" in _refused(capsys, junk)
    assert "not found" in _refused(capsys, tmp_path / "nope.parquet")


def test_dictionary_encoded_columns_read_as_their_values(tmp_path):
    """pandas categoricals and Arrow dictionaries: times, metrics and labels as text."""
    n = 30
    p = _parquet(tmp_path, {
        "entity": pa.array(["n1"] * n).dictionary_encode(),
        "timestamp": pa.array([(T0 + timedelta(hours=i)).isoformat() for i in range(n)])
        .dictionary_encode(),
        "cpu": pa.array([str(i % 4) for i in range(n)]).dictionary_encode(),
        "label": pa.array(["1" if i == 25 else "0" for i in range(n)]).dictionary_encode(),
    })  # fmt: skip
    (m,) = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False)).machines
    assert m.train[:, 0].tolist() == [float(i % 4) for i in range(15)]
    assert m.labels.tolist() == [int(i == 25) for i in range(15, n)]


def test_timestamps_past_2262_read(tmp_path):
    """Nanoseconds end in 2262; a far-future failure time stands for "never" in exports."""
    n = 30
    far = datetime(9999, 12, 31, tzinfo=UTC)
    p = _parquet(tmp_path, {
        "entity": [f"m{k}" for k in range(4) for _ in range(n)],
        "timestamp": pa.array([T0 + timedelta(hours=i) for _ in range(4) for i in range(n)],
                              pa.timestamp("ms", tz="UTC")),
        "temp": [40.0 + i % 3 for _ in range(4) for i in range(n)],
        "failure_time": pa.array([far] * (4 * n), pa.timestamp("ms", tz="UTC")),
    })  # fmt: skip
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False))
    failure = (ds.train + ds.test)[0].failure_time
    assert failure == (far - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() / 3600
