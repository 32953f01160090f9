"""Fleet CSV ingestion: every bad input is one `Error: ...` line naming the row and the
column, with exit code 2; the good forms (ISO and epoch times, splits, counters with
resets, dropped polls, the transceiver profile) come out as the models expect."""

import numpy as np
import pytest

from services.health import eval as health_eval
from services.health import eval_prediction, fleetcsv, windows


def _write(tmp_path, lines, name="fleet.csv"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _refused(capsys, path, *extra):
    rc = health_eval.main(["--dataset", f"csv:{path}", "--no-progress", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("Error: ")
    return err[0]


PRED = "entity,timestamp,temp,failure_time"


@pytest.mark.parametrize(
    "lines, says",
    [
        (["entity,temp,failure_time", "m1,40,"], "row 1 (header): missing column 'timestamp'"),
        (["timestamp,temp,label", "0,40,0"], "row 1 (header): missing column 'entity'"),
        ([], "row 1 (header): no column names (an empty file?)"),
        (["entity;timestamp;temp;label", "m1;0;40;0"], "fields must be separated by commas"),
        (["entity,timestamp,label", "m1,0,0"], "row 1 (header): no metric column"),
        ([PRED, "m1,0,40,", "m1,1,inf,"], "row 3, column 'temp': 'inf' is not a finite number"),
        ([PRED, "m1,0,-Infinity,"], "row 2, column 'temp': '-Infinity' is not a finite number"),
        (["entity,timestamp,temp", "m1,0,40"], "need exactly one of the columns 'label'"),
        (["entity,timestamp,temp,temp,label", "m1,0,1,2,0"], "column 'temp' appears twice"),
        ([PRED, "m1,0,40,", "m1,1,hot,"], "row 3, column 'temp': 'hot' is not a number"),
        ([PRED, "m1,0,40,", "m1,yesterday,41,"], "row 3, column 'timestamp': 'yesterday'"),
        ([PRED, "m1,0,40,soon"], "row 2, column 'failure_time': 'soon'"),
        ([PRED, "m1,0,40,9", "m1,1,40,10"], "row 3, column 'failure_time': '10' differs"),
        (
            [
                PRED,
                "m1,0,40",
            ],
            "row 2: 3 fields, the header has 4",
        ),
        ([PRED, ",0,40,"], "row 2, column 'entity': empty"),
        (["entity,timestamp,temp,label", "m1,0,40,2"], "row 2, column 'label': '2' is not 0 or 1"),
        (
            [PRED + ",split", "m1,0,40,,train", "m1,1,40,,test"],
            "row 3, column 'split': entity 'm1' is in more than one split (rows 2 and 3)",
        ),
        ([PRED + ",split", "m1,0,40,,train", "m1,1,40,,later"], "row 3, column 'split': 'later'"),
        ([PRED + ",split", "m1,0,40,,train", "m2,1,40,,"], "given for some entities and not"),
        ([PRED], "no data rows"),
        (
            [PRED + ",split", "m1,0,40,,train", "m1,1,40,,train", "m2,0,40,,train"],
            "no test entity among 2 (evaluating needs both",
        ),
        ([PRED, "m1,4,40,", "m1,5,40,", "m1,5,41,"], "entity 'm1': two rows at timestamp 5 "
         "differ (column 'temp')"),
        (["entity,timestamp,temp,label", "m1,5,40,0", "m1,5,40,1"], "column 'label/split'"),
        (
            [PRED + ",split", *[f"m1,{t},40,,train" for t in range(5)], "m1,-1e9,40,,train",
             "m2,0,40,,test", "m2,1,40,,test"],
            "entity 'm1': its gaps would add 999,999,99",
        ),
        ([PRED, "m1,0,40,", "m1,1,1e40,"], "row 3, column 'temp': '1e40' is not within float32"),
        ([PRED, "m1,5,40,5", "m1,6,40,5", "m2,0,40,"],
         "row 2, column 'failure_time': entity 'm1' failed at or before its first poll"),
        ([",entity,timestamp,temp,failure_time", "0,m1,0,40,"], "column 1 has no name"),
        ([PRED + ",", "m1,0,40,,"], "column 5 has no name: a comma at the end of every line"),
        (["entity,timestamp,cpu,label,split", "m1,0,1,0,train", "m1,1,1,0,", "m1,2,1,0,test"],
         "row 3, column 'split': empty, while other rows of entity 'm1' have one"),
        (["entity,timestamp,cpu,label", "m1,0,1,0", "m1,1,2,0", "m1,2,5,1"],
         "entity 'm1' has 1 training row(s): detection needs at least 2"),
        ([PRED, *[f"m{k},{t},40,{30 if k == 0 else ''}" for k in range(2) for t in range(20)]],
         "training entities: prediction needs at least 3"),
    ],
)  # fmt: skip
def test_bad_file_is_one_line_naming_row_and_column(tmp_path, capsys, lines, says):
    assert says in _refused(capsys, _write(tmp_path, lines))


def test_missing_file_and_bad_options(tmp_path, capsys):
    assert "not found" in _refused(capsys, tmp_path / "nope.csv")
    two_polls = _write(tmp_path, [PRED, "m1,0,40,", "m1,1,40,"])
    assert "the poll interval is 0 h" in _refused(capsys, two_polls, "--poll-interval", "0")
    said = _refused(capsys, two_polls, "--machines", "m1")
    assert (
        said
        == "Error: --machines is for smd and asd; csv:" + str(two_polls) + " is evaluated whole"
    )
    for horizon in ("0", "-5", "inf", "nan"):
        said = _refused(capsys, two_polls, f"--horizon={horizon}")
        assert said == f"Error: --horizon must be above 0 and finite, got {float(horizon):g}"
    with pytest.raises(fleetcsv.CsvError, match="--profile"):
        fleetcsv.load(str(_write(tmp_path, [PRED, "m1,0,1,"])), fleetcsv.CsvOptions(profile="x"))


def test_iso_and_epoch_times_everywhere(tmp_path):
    iso = _write(
        tmp_path,
        [
            PRED,
            "m1,2026-01-01T00:00:00Z,40,2026-01-01T03:00:00+00:00",
            "m1,2026-01-01T01:00:00,41,2026-01-01T03:00:00Z",
            "m2,2026-01-01T00:00:00Z,40,",
            "m2,2026-01-01T02:00:00Z,40,",
        ],
        "iso.csv",
    )
    epoch = _write(
        tmp_path,
        [
            PRED,
            "m1,1767225600,40,1767236400",
            "m1,1767229200,41,1767236400",
            "m2,1767225600,40,",
            "m2,1767232800,40,",
        ],
        "epoch.csv",
    )
    a = fleetcsv.load(str(iso), fleetcsv.CsvOptions(poll_interval=1.0, progress=False))
    b = fleetcsv.load(
        str(epoch), fleetcsv.CsvOptions(poll_interval=1.0, time_unit="s", progress=False)
    )
    for ds in (a, b):
        ents = {e.name: e for e in ds.train + ds.test}
        assert ents["m1"].failure_time - ents["m1"].t[0] == 3.0
        # m2 missed the poll at 01:00: it is inserted as a missed poll.
        assert (ents["m2"].t - ents["m2"].t[0]).tolist() == [0.0, 1.0, 2.0]
        assert np.isnan(ents["m2"].x[1]).all()


def test_split_column_and_detection_rows(tmp_path):
    p = _write(
        tmp_path,
        [PRED + ",split", "m1,0,40,,train", "m1,1,40,,train", "m2,0,40,5,test", "m2,1,41,5,test"],
    )
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False))
    assert [e.name for e in ds.train] == ["m1"] and [e.name for e in ds.test] == ["m2"]
    det = _write(
        tmp_path,
        ["entity,timestamp,cpu,label,split"]
        + [f"n1,{i},{i % 3},{int(i == 4)},{'train' if i < 3 else 'test'}" for i in range(6)],
        "det.csv",
    )
    (m,) = fleetcsv.load(str(det), fleetcsv.CsvOptions(progress=False)).machines
    assert m.train.shape == (3, 1) and m.labels.tolist() == [0, 1, 0]


def test_gaps_follow_the_declared_poll_interval():
    t = np.array([0.0, 0.25, 1.0, 1.25, 1.6])
    x = np.arange(5, dtype=np.float32)[:, None]
    tt, xx = fleetcsv.fill_gaps(t, x, 0.25)
    assert tt.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.6]  # 0.35 apart: not a gap
    assert np.isnan(xx[[2, 3], 0]).all() and xx[[0, 1, 4, 5, 6], 0].tolist() == [0, 1, 2, 3, 4]


def test_counter_resets_cumulative_and_delta():
    cum = windows._increments(np.array([0.0, 5.0, 9.0, 2.0, 6.0]))  # reset after 9
    assert np.expm1(cum).round(6).tolist() == [0.0, 5.0, 4.0, 2.0, 4.0]
    d = windows._deltas(np.array([3.0, np.nan, -7.0, 4.0]))  # missed poll, then a reset
    assert np.expm1(d).round(6).tolist() == [3.0, 3.0, 0.0, 4.0]


def test_transceiver_profile_and_counter_kinds(tmp_path):
    head = (
        "entity,timestamp,rx_dbm_0,rx_dbm_1,temp_c,fec_corrected,flaps_total,err_delta,failure_time"
    )
    p = _write(tmp_path, [head, "m1,0,-3,-3,40,10,0,1,", "m1,0.25,-3,-3,40,20,0,2,"])
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(profile="transceiver", progress=False))
    assert ds.notes["lanes"] == [["rx_dbm_0", "rx_dbm_1"]]
    assert ds.notes["counters"] == ["flaps_total", "fec_corrected"]
    assert ds.notes["deltas"] == ["err_delta"]
    st = eval_prediction.settings(ds)
    assert (st["length"], st["shift"], st["balanced"]) == (24, 24, False)
    plain = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False))
    assert "lanes" not in plain.notes and eval_prediction.settings(plain)["shift"] is None


def test_progress_bar_on_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fleetcsv, "PROGRESS_MIN_BYTES", 0)
    p = _write(tmp_path, [PRED] + [f"m{i % 3},{i},40," for i in range(50)])
    fleetcsv.load(str(p), fleetcsv.CsvOptions())
    assert "100%" in capsys.readouterr().err


def test_help_names_the_data_dir_and_the_schema(capsys):
    with pytest.raises(SystemExit) as done:
        health_eval.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "STALWART_DATA_DIR" in out and "failure_time" in out and "_delta" in out


def test_csv_detection_runs_leave_machines_out_end_to_end(tmp_path, capsys):
    import json

    rng = np.random.default_rng(0)
    lines = ["entity,timestamp,cpu,mem,label"]
    for k in range(3):
        x = rng.normal(0, 1, (300, 2))
        x[250:260] += 8.0  # one anomaly in each test half
        lines += [f"n{k},{i},{x[i, 0]:.4f},{x[i, 1]:.4f},{int(250 <= i < 260)}" for i in range(300)]
    p = _write(tmp_path, lines)
    rc = health_eval.main(
        ["--dataset", f"csv:{p}", "--holdout-machines", "-o", "json", "--no-progress"]
    )
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["task"] == "detection_holdout"
    assert r["reported"] == ["n0", "n1", "n2"]
    assert {"chosen", "pca", "isolation_forest", "ensemble"} <= set(r["mean"])
    # An 8-sigma shift on both metrics: the chosen detector finds every one.
    assert r["mean"]["chosen"]["event"]["event_recall"] == 1.0


def test_small_blocks_read_as_one_block_does(tmp_path, monkeypatch):
    lines = [PRED + ",split"] + [
        f"m{i % 4},{i // 4},{40 + i % 7},{'' if i % 4 else 99},{'test' if i % 4 == 3 else 'train'}"
        for i in range(200)
    ]
    p = _write(tmp_path, lines)
    opts = fleetcsv.CsvOptions(progress=False)
    whole = fleetcsv.load(str(p), opts)
    monkeypatch.setattr(fleetcsv, "BLOCK_BYTES", 64)  # a few rows a batch
    blocks = fleetcsv.load(str(p), opts)
    assert [e.name for e in blocks.train] == ["m0", "m1", "m2"]
    for a, b in zip(whole.train + whole.test, blocks.train + blocks.test, strict=True):
        assert a.name == b.name
        np.testing.assert_array_equal(a.failure_time, b.failure_time)  # NaN equals NaN here
        np.testing.assert_array_equal(a.t, b.t)
        np.testing.assert_array_equal(a.x, b.x)


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
def test_rows_are_named_by_their_line_across_blocks_and_blank_lines(
    tmp_path, capsys, monkeypatch, block_bytes
):
    monkeypatch.setattr(fleetcsv, "BLOCK_BYTES", block_bytes)
    good = [f"m1,{i},40," for i in range(30)]
    bad_cell = [PRED, *good[:10], "", "", *good[10:], "", "m1,31,warm,"]
    assert "row 35, column 'temp': 'warm'" in _refused(capsys, _write(tmp_path, bad_cell))
    short = [PRED, *good[:5], "", "m1,6,40"]
    assert "row 8: 3 fields, the header has 4" in _refused(capsys, _write(tmp_path, short))
    differs = [PRED, "m1,0,40,9", "", "m1,1,40,9", "m1,2,40,10"]
    assert (
        "row 5, column 'failure_time': '10' differs from the entity's failure time on row 2"
    ) in _refused(capsys, _write(tmp_path, differs))


def test_blank_lines_and_spaces_read_as_before(tmp_path):
    p = _write(
        tmp_path, [PRED, " m1 , 0 , 40 , ", "", "m1,1, NA ,", ",,,", "m1,2,nan,", "m2,0,1e1,"]
    )  # a blank line and a row of commas: skipped
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(poll_interval=1.0, progress=False))
    ents = {e.name: e for e in ds.train + ds.test}
    assert ents["m1"].t.tolist() == [0.0, 1.0, 2.0] and ents["m2"].x[:, 0].tolist() == [10.0]
    assert ents["m1"].x[0, 0] == 40 and np.isnan(ents["m1"].x[1:, 0]).all()


def test_numbers_arrow_does_not_read_are_read_as_python_reads_them(tmp_path):
    p = _write(tmp_path, [PRED, "m1,0,1_000,", "m1,1,2_5e-1,", "m1,2,-.5,"])
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(poll_interval=1.0, progress=False))
    (e,) = ds.train + ds.test
    assert e.x[:, 0].tolist() == [1000.0, 2.5, -0.5]


def test_a_byte_order_mark_before_the_header_is_read_past(tmp_path):
    p = tmp_path / "excel.csv"
    p.write_text("\n".join([PRED, "m1,0,40,", "m1,1,41,"]) + "\n", encoding="utf-8-sig")
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(poll_interval=1.0, progress=False))
    (e,) = ds.train + ds.test
    assert e.name == "m1" and e.x[:, 0].tolist() == [40.0, 41.0]


def test_a_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    p = tmp_path / "latin1.csv"
    p.write_bytes(b"entity,timestamp,temp,failure_time\nm\xe9,0,40,\n")
    line = _refused(capsys, p)
    assert "row 2" in line and "cannot be read" in line, line


@pytest.mark.parametrize("block_bytes", [40, 1 << 20])
def test_a_quoted_line_break_stays_in_its_cell(tmp_path, monkeypatch, block_bytes):
    monkeypatch.setattr(fleetcsv, "BLOCK_BYTES", block_bytes)  # blocks cut inside the quotes
    p = _write(tmp_path, [PRED, '"rack 1', 'm1",0,40,', '"rack 1', 'm1",1,41,', "m2,0,40,"])
    ds = fleetcsv.load(str(p), fleetcsv.CsvOptions(progress=False))
    ents = {e.name: e for e in ds.train + ds.test}
    assert set(ents) == {"rack 1\nm1", "m2"} and ents["rack 1\nm1"].x[:, 0].tolist() == [40, 41]


def test_a_poll_sent_twice_is_one_poll(tmp_path):
    """An export that repeats a row (same entity, time and values) reads as if it had
    not: no zero-length interval, no extra row, the same median spacing."""
    rows = [PRED, "m1,0,40,", "m1,1,41,", "m1,2,42,", "m2,0,40,", "m2,1,40,"]
    once = fleetcsv.load(
        str(_write(tmp_path, rows, "once.csv")), fleetcsv.CsvOptions(progress=False)
    )
    twice = fleetcsv.load(
        str(_write(tmp_path, [*rows, "m1,1,41,", "m2,0,40,"], "twice.csv")),
        fleetcsv.CsvOptions(progress=False),
    )
    assert twice.step == once.step == 1.0
    for a, b in zip(once.train + once.test, twice.train + twice.test, strict=True):
        assert a.name == b.name and a.t.tolist() == b.t.tolist()
        assert np.array_equal(a.x, b.x, equal_nan=True)


def test_lowercase_z_and_float_labels_as_exports_write_them(tmp_path):
    lines = ["entity,timestamp,cpu,label", *[f"m1,2026-01-01t{h:02d}:00:00z,{h % 3},0.0"
                                            for h in range(10)], "m1,2026-01-01t10:00:00z,9,1.0"]  # fmt: skip
    (m,) = fleetcsv.load(str(_write(tmp_path, lines)), fleetcsv.CsvOptions(progress=False)).machines
    assert m.labels.tolist() == [0] * 5 + [1]


def test_the_parquet_prefix_reads_parquet_whatever_the_suffix(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "export"  # no suffix: csv: would read it as text
    rows = [(f"m{k}", float(t), 40.0 + t % 3) for k in range(4) for t in range(30)]
    columns = dict(zip(["entity", "timestamp", "temp"], zip(*rows, strict=True), strict=True))
    pq.write_table(pa.table({**columns, "failure_time": [None] * len(rows)}), path)
    ds = health_eval.load(f"parquet:{path}", None, 0, None)
    assert ds.name == "parquet:export" and len(ds.train) + len(ds.test) == 4
    with pytest.raises(fleetcsv.CsvError, match="cannot be read"):
        health_eval.load(f"csv:{path}", None, 0, None)


def test_a_time_in_a_message_can_be_found_in_the_file(tmp_path, capsys):
    lines = [PRED, "m1,1700000000,40,", "m1,1700000060,40,", "m1,1700000060,41,"]
    said = _refused(capsys, _write(tmp_path, lines), "--time-unit", "s")
    assert "two rows at timestamp 1700000060 (2023-11-14T22:14:20Z) differ" in said


def test_a_bad_flag_is_one_line_too(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        health_eval.main(["--dataset", "csv:x.csv", "--poll-interval", "abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1
    assert err[0].startswith("Error: argument --poll-interval: invalid float value: 'abc'")


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_64_bit_counter_keeps_every_unit(tmp_path, form):
    """Byte and FEC counters run past 2^24, where float32 moves in steps of 1,024 (at
    1e10): their increments come out exact, read from either format, through a poll
    sent twice, a missed poll (spread over the gap), a reset, and time out of order."""
    base = 10_000_000_000
    polls = [(0, base), (1, base + 3), (1, base + 3), (2, base + 10), (4, base + 14), (6, 12),
             (5, 7)]  # fmt: skip
    rows = [(f"m{k}", float(t), 40.0, v + k, None) for k in range(3) for t, v in polls]
    header = ["entity", "timestamp", "temp", "fec_total", "failure_time"]
    if form == "csv":
        cells = [",".join("" if c is None else str(c) for c in r) for r in rows]
        path = _write(tmp_path, [",".join(header), *cells])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "fleet.parquet"
        columns = dict(zip(header, zip(*rows, strict=True), strict=True))
        columns["fec_total"] = pa.array(columns["fec_total"], pa.int64())
        pq.write_table(pa.table(columns), path)
    ds = fleetcsv.load(str(path), fleetcsv.CsvOptions(progress=False, poll_interval=1.0))
    (m0,) = [e for e in ds.train + ds.test if e.name == "m0"]
    assert m0.t.tolist() == [0, 1, 2, 3, 4, 5, 6]
    cleaned = windows.clean(m0, windows.counter_columns(ds))
    increments = np.expm1(cleaned[:, 1].astype(np.float64)).round(3).tolist()
    # t=3 is a missed poll: it repeats the last increment, and the 4 counted over the
    # gap are spread over its two polls; at t=5 the counter restarted from 0
    assert increments == [0, 3, 7, 7, 2, 7, 5]
