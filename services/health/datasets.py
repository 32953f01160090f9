"""Loaders for the health evaluation data sets.

Two shapes of data come out of here:

- ``DetectionSet`` (smd, asd, csv with a ``label`` column: see ``fleetcsv``): per machine an unlabelled
  training series, a test series and its point labels. Detectors fit on train only.
- ``PredictionSet`` (cmapss, transceiver, csv with a ``failure_time`` column): entities
  (engines, optical modules) observed over time, some of which fail. The task is
  "fails within ``horizon`` time units", judged per window and per entity.

Public data sets are read from ``$STALWART_DATA_DIR`` (default: ``../shared/data`` relative
to the repository root) and never copied. A missing data set raises ``DatasetMissing``
whose message says in one line where to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stalwart.datadir import data_dir

_SOURCES = {
    "smd": "NetManAIOps/OmniAnomaly ServerMachineDataset (labels) + zhhlee/InterFusion data/processed (metrics)",
    "asd": "zhhlee/InterFusion data/processed omi-<n> (ASD)",
    "cmapss-fd001": "NASA Ames Prognostics Data Repository, 'Turbofan Engine Degradation Simulation' (CMAPSSData.zip, FD001)",
}


class DatasetMissing(FileNotFoundError):
    """A data set is not on disk; the message says where to get it."""


def _folder(name: str) -> Path:
    path = data_dir() / name
    if not path.is_dir():
        raise DatasetMissing(
            f"{name} not found at {path}: get it from {_SOURCES[name]} "
            f"(layout in shared/data/{name}/README.md) or set STALWART_DATA_DIR"
        )
    return path


# --------------------------------------------------------------------------- detection


@dataclass
class Machine:
    name: str
    train: np.ndarray  # (n_train, d) float32, unlabelled
    test: np.ndarray  # (n_test, d) float32
    labels: np.ndarray  # (n_test,) int8, 1 = anomalous point


@dataclass
class DetectionSet:
    name: str
    machines: list[Machine]


def _lab_layout(folder: str, machines: list[str] | None) -> DetectionSet:
    """SMD and ASD share one layout: train/<m>.txt.gz, test/<m>.txt.gz, test_label/<m>.txt."""
    root = _folder(folder)
    available = sorted(p.name[: -len(".txt.gz")] for p in (root / "test").glob("*.txt.gz"))
    wanted = machines or available
    unknown = [m for m in wanted if m not in available]
    if unknown:
        raise DatasetMissing(
            f"{folder}: no metrics for {', '.join(unknown)} in {root} "
            f"(available: {', '.join(available)}); get them from {_SOURCES[folder]}"
        )
    out = []
    for m in wanted:
        train = _finite_rows(root / "train" / f"{m}.txt.gz")
        test = _finite_rows(root / "test" / f"{m}.txt.gz")
        labels = np.loadtxt(root / "test_label" / f"{m}.txt", dtype=np.int8, ndmin=1)
        if labels.shape[0] != test.shape[0]:
            raise ValueError(f"{folder}/{m}: {labels.shape[0]} labels for {test.shape[0]} rows")
        if train.shape[1] != test.shape[1]:
            raise ValueError(
                f"{folder}/{m}: {train.shape[1]} metrics in train, {test.shape[1]} in test"
            )
        out.append(Machine(m, train, test, labels))
    return DetectionSet(folder, out)


def _finite_rows(path: Path) -> np.ndarray:
    """(rows, metrics) float32 from a comma-separated file; a value that is missing or
    not finite is refused with its line, since no detector can score it."""
    x = np.loadtxt(path, delimiter=",", dtype=np.float32, ndmin=2)
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if bad.size:
        raise ValueError(f"{path}: line {bad[0] + 1} holds a value that is not a finite number")
    return x


def load_smd(machines: list[str] | None = None) -> DetectionSet:
    return _lab_layout("smd", machines)


def load_asd(machines: list[str] | None = None) -> DetectionSet:
    return _lab_layout("asd", machines)


# --------------------------------------------------------------------------- prediction


@dataclass
class Entity:
    name: str
    t: np.ndarray  # (T,) time of each sample, increasing
    x: np.ndarray  # (T, d) float32; NaN marks a missing sample
    failure_time: float = float("nan")  # NaN: did not fail while observed
    kind: str = ""  # failure mode or healthy variant (generator ground truth, for reports)
    warning: float = float("nan")  # how long before failure the precursor starts
    visible_warning: float = float("nan")  # how long before failure it shows in the signals
    # float64 values of columns float32 cannot hold to the unit (a fleet file's
    # cumulative counters), by column: what cleaning reads for them instead of x
    exact: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class PredictionSet:
    name: str
    channels: list[str]
    train: list[Entity]
    test: list[Entity]
    horizon: float  # label = fails within this many time units
    time_unit: str
    step: float  # nominal sampling interval, in time units
    notes: dict = field(default_factory=dict)


def _cmapss_entities(rows: np.ndarray, keep: np.ndarray, rul_end: np.ndarray | None):
    out = []
    for unit in np.unique(rows[:, 0]).astype(int):
        r = rows[rows[:, 0] == unit]
        cycles = r[:, 1]
        # Train engines fail at their last cycle (RUL 0 there); test engines stop
        # rul_end cycles before failure.
        end = cycles[-1] + (rul_end[unit - 1] if rul_end is not None else 0.0)
        out.append(Entity(f"unit-{unit}", cycles, r[:, keep].astype(np.float32), float(end)))
    return out


def load_cmapss(horizon: float = 30.0) -> PredictionSet:
    """C-MAPSS FD001. Label: the engine fails within ``horizon`` cycles (RUL <= horizon)."""
    root = _folder("cmapss-fd001")
    train = np.loadtxt(root / "train_FD001.txt")
    test = np.loadtxt(root / "test_FD001.txt")
    rul = np.loadtxt(root / "RUL_FD001.txt")
    names = ["unit", "cycle", "op1", "op2", "op3"] + [f"s{i}" for i in range(1, 22)]
    # Only the 14 sensors that move in FD001: the others (op settings, s1, s5, s6, s10,
    # s16, s18, s19) are constant up to rounding under its single operating condition.
    informative = [
        "s2",
        "s3",
        "s4",
        "s7",
        "s8",
        "s9",
        "s11",
        "s12",
        "s13",
        "s14",
        "s15",
        "s17",
        "s20",
        "s21",
    ]
    keep = np.array([names.index(c) for c in informative])
    return PredictionSet(
        name="cmapss",
        channels=[names[i] for i in keep],
        train=_cmapss_entities(train, keep, None),
        test=_cmapss_entities(test, keep, rul),
        horizon=horizon,
        time_unit="cycles",
        step=1.0,
    )


# --------------------------------------------------------------------------- csv


def load_csv(path: str, horizon: float = 24.0, seed: int = 0, **opts):
    """A fleet export in ``fleetcsv.SCHEMA`` (streamed; bad rows raise ``CsvError``, a
    ValueError naming the row and column). ``opts``: the rest of ``fleetcsv.CsvOptions``."""
    from services.health import fleetcsv  # it imports the dataclasses above

    return fleetcsv.load(path, fleetcsv.CsvOptions(horizon=horizon, seed=seed, **opts))
