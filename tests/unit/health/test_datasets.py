"""Loaders and the transceiver generator."""

from types import SimpleNamespace

import numpy as np
import pytest

from services.health import datasets, transceiver
from services.health.windows import clean, make_windows

from .conftest import load_or_skip


def test_generator_is_deterministic():
    a = transceiver.generate(12, seed=7)
    b = transceiver.generate(12, seed=7)
    c = transceiver.generate(12, seed=8)
    assert all(np.array_equal(x.x, y.x, equal_nan=True) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0].x, c[0].x, equal_nan=True)


def test_generator_ranges_and_mix():
    ents = transceiver.generate(60, seed=3)
    kinds = {e.kind for e in ents}
    assert set(transceiver.FAILURE_MODES) <= kinds
    assert kinds & set(transceiver.ALARMING_KINDS) and "healthy" in kinds
    ch = transceiver.CHANNELS
    healthy = np.concatenate([e.x for e in ents if e.kind == "healthy"])
    rx = healthy[:, ch.index("rx_dbm_0")]
    vcc = healthy[:, ch.index("vcc_v")]
    assert -6.0 < np.nanmin(rx) and np.nanmax(rx) < 0.5
    assert 3.2 < np.nanmin(vcc) and np.nanmax(vcc) < 3.4
    missing = np.isnan(healthy[:, 0]).mean()
    assert 0.005 < missing < 0.1
    # counters only ever grow within a module
    for e in ents[:10]:
        col = e.x[:, ch.index("fec_corrected")]
        assert np.all(np.diff(col[~np.isnan(col)]) >= 0)


def test_failing_modules_end_before_failure_with_precursor():
    ents = transceiver.generate(40, seed=5)
    ch = transceiver.CHANNELS
    for e in ents:
        if e.kind in transceiver.FAILURE_MODES:
            assert e.t[-1] < e.failure_time <= e.t[-1] + 2 * transceiver.STEP_H
        if e.kind == "rx_decay":
            rx = e.x[:, [ch.index(f"rx_dbm_{i}") for i in range(4)]]
            # some lane falls far below its starting level by the last polls
            assert np.nanmin(rx[-8:]) < np.nanmin(rx[:8]) - 5.0


def test_visible_warning_is_when_the_precursor_shows():
    ents = transceiver.generate(60, seed=3)
    for e in ents:
        if e.kind not in transceiver.FAILURE_MODES:
            assert np.isnan(e.visible_warning) and np.isnan(e.warning)
            continue
        # it shows at a poll at or after its onset; a sudden death never shows one
        assert 0.0 <= e.visible_warning <= e.warning
        assert (e.visible_warning == 0.0) == (e.kind == "sudden_death")
    fec = [e for e in ents if e.kind == "fec_burst"]
    # bursts stay rare early in the escalation: they show hours after it begins, and two
    # of these five modules began more than 2 h ahead but showed less than 2 h ahead
    assert [round(e.warning, 2) for e in fec] == [15.54, 3.65, 3.75, 15.37, 11.15]
    assert [round(e.visible_warning, 2) for e in fec] == [6.75, 0.75, 0.25, 8.0, 3.0]
    # a steady ramp in dB shows within a few polls of its onset
    rx = [e for e in ents if e.kind == "rx_decay"]
    assert [round(e.visible_warning, 2) for e in rx] == [20.5, 16.5, 16.5, 9.25, 13.0]


def test_a_burst_like_the_links_usual_ones_shows_no_precursor():
    calm = np.full(100, 1000.0)
    calm[[10, 50]] = 1e5  # the link bursts now and then without failing
    one, pair = calm.copy(), calm.copy()
    one[80] = 1e5  # one more burst, on its own
    pair[[80, 81]] = 1e5  # two in a row, denser than the link ever bursts
    quiet = SimpleNamespace(fec_rate=calm, n=100)
    assert not transceiver._denser_fec(SimpleNamespace(fec_rate=one, n=100), quiet).any()
    seen = transceiver._denser_fec(SimpleNamespace(fec_rate=pair, n=100), quiet)
    assert np.flatnonzero(seen).tolist()[0] == 81


def test_windows_labels_and_teacher_shift():
    e = datasets.Entity("a", np.arange(10.0), np.zeros((10, 2), np.float32), failure_time=10.0)
    w = make_windows([e], [clean(e, [])], length=3, horizon=4.0, shift=2)
    assert w.y.tolist() == [0] * 6 + [1] * 4  # t >= 6 fails within 4
    assert (w.future_end - w.end).tolist() == [2] * 8 + [1, 0]  # clipped at the last sample
    assert w.batch(np.array([0])).shape == (1, 3, 3)  # 2 channels + missed flag


def test_clean_turns_counters_into_increments():
    x = np.array([[0.0], [10.0], [np.nan], [40.0]], np.float32)
    e = datasets.Entity("a", np.arange(4.0), x)
    out = clean(e, [0])
    # 10 in one poll; then 30 over two polls -> 15 each, the missed poll repeating 10
    assert np.expm1(out[:, 0]).round(3).tolist() == [0.0, 10.0, 10.0, 15.0]
    assert out[:, 1].tolist() == [0, 0, 1, 0]


def test_csv_detection_and_prediction(tmp_path):
    det = tmp_path / "det.csv"
    rows = ["entity,timestamp,cpu,mem,label"]
    rows += [f"n1,{i},{i % 3},{1.0 if i != 5 else ''},{int(i >= 8)}" for i in range(10)]
    det.write_text("\n".join(rows) + "\n")
    ds = datasets.load_csv(str(det))
    (m,) = ds.machines
    assert m.train.shape == (5, 2) and m.test.shape == (5, 2)
    assert m.labels.tolist() == [0, 0, 0, 1, 1]
    assert not np.isnan(m.test).any()

    pred = tmp_path / "pred.csv"
    rows = ["entity,timestamp,temp,errors_total,failure_time"]
    rows += [
        f"m{k},{i},{40 + i},{3 * i},{'' if k % 2 else 12}" for k in range(4) for i in range(15)
    ]
    pred.write_text("\n".join(rows) + "\n")
    ps = datasets.load_csv(str(pred), horizon=5.0, seed=1)
    ents = ps.train + ps.test
    assert len(ents) == 4 and len(ps.test) == 1
    failing = [e for e in ents if np.isfinite(e.failure_time)]
    assert all(e.t.max() < 12 for e in failing)  # rows at/after failure dropped
    assert ps.notes["counters"] == ["errors_total"]


def test_csv_rejects_bad_schema(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("entity,cpu\nx,1\n")
    with pytest.raises(ValueError, match="timestamp"):
        datasets.load_csv(str(bad))


def test_missing_dataset_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STALWART_DATA_DIR", str(tmp_path))
    with pytest.raises(datasets.DatasetMissing, match="get it from"):
        datasets.load_smd()


def _lab_machine(root, name, train: str, test: str, labels: str):
    import gzip

    for part, text in (("train", train), ("test", test)):
        (root / "smd" / part).mkdir(parents=True, exist_ok=True)
        (root / "smd" / part / f"{name}.txt.gz").write_bytes(gzip.compress(text.encode()))
    (root / "smd" / "test_label").mkdir(parents=True, exist_ok=True)
    (root / "smd" / "test_label" / f"{name}.txt").write_text(labels)


def test_lab_layout_refuses_what_no_detector_can_score(tmp_path, monkeypatch):
    """A missing or infinite value names its file and line; train and test of one machine
    must have the same metrics; a one-row test file is still a table."""
    monkeypatch.setenv("STALWART_DATA_DIR", str(tmp_path))
    _lab_machine(tmp_path, "nan", "1,2\n3,4\n", "1,2\n3,nan\n", "0\n1\n")
    _lab_machine(tmp_path, "wide", "1,2,3\n3,4,5\n", "1,2\n3,4\n", "0\n1\n")
    _lab_machine(tmp_path, "one", "1,2\n3,4\n", "5,6\n", "1\n")
    with pytest.raises(ValueError, match=r"test/nan.txt.gz: line 2 holds a value that is not a"):
        datasets.load_smd(["nan"])
    with pytest.raises(ValueError, match="smd/wide: 3 metrics in train, 2 in test"):
        datasets.load_smd(["wide"])
    (m,) = datasets.load_smd(["one"]).machines
    assert m.test.shape == (1, 2) and m.labels.tolist() == [1]


def test_smd_and_cmapss_shapes():
    smd = load_or_skip(datasets.load_smd, ["machine-2-7"])
    (m,) = smd.machines
    assert m.train.shape[1] == 38 and len(m.labels) == len(m.test)
    cm = load_or_skip(datasets.load_cmapss)
    assert len(cm.train) == 100 and len(cm.test) == 100 and len(cm.channels) == 14
    # test engines stop RUL cycles before failure (RUL_FD001 line 1 is 112)
    assert cm.test[0].failure_time - cm.test[0].t[-1] == pytest.approx(112.0)
