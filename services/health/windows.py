"""Turn entities (engines, optical modules) into labelled sliding windows.

Cleaning is causal, as it would be online: a missed poll repeats the last reading,
cumulative counters become per-poll increments on a log scale, and one extra channel says
the poll was missed. Windows are kept as indices into one concatenated array, so the
teacher's "future" windows and the student's windows share memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from services.health.datasets import Entity, PredictionSet


def _ffill(x: np.ndarray) -> np.ndarray:
    """Forward-fill NaNs per column; leading NaNs take the first valid value."""
    x = x.copy()
    for c in range(x.shape[1]):
        col = x[:, c]
        ok = ~np.isnan(col)
        if not ok.any():
            col[:] = 0.0
            continue
        idx = np.where(ok, np.arange(len(col)), 0)
        np.maximum.accumulate(idx, out=idx)
        filled = col[idx]
        filled[: np.argmax(ok)] = col[ok][0]
        x[:, c] = filled
    return x


def _increments(col: np.ndarray) -> np.ndarray:
    """Per-poll increments of a cumulative counter. Counts accrued over a gap are spread
    evenly over it (known only when the gap ends, so missing polls repeat the previous
    increment instead of looking ahead). A drop is a reset, as in Prometheus: the counter
    restarted from 0, so the increment is the value after the drop."""
    out = np.zeros(len(col))
    valid = np.flatnonzero(~np.isnan(col))
    if valid.size > 1:
        v = col[valid]
        step = np.diff(v)
        rate = np.where(step < 0, v[1:], step) / np.diff(valid)
        out[valid[1:]] = rate
        last = np.full(len(col), np.nan)
        last[valid] = out[valid]
        out = _ffill(last[:, None])[:, 0]
    return np.log1p(out)


def _deltas(col: np.ndarray) -> np.ndarray:
    """Per-poll increments reported as such: a negative one is a reset artefact (the
    source subtracted across a restart) and counts as 0; a missed poll repeats the last."""
    d = np.where(col < 0, 0.0, col)
    return np.log1p(_ffill(d[:, None])[:, 0])


def clean(e: Entity, counters: list[int], deltas: tuple[int, ...] = ()) -> np.ndarray:
    """(T, d) raw -> (T, d+1) float32: filled gauges, log counter increments (cumulative
    ``counters`` and per-poll ``deltas``), missed flag."""
    raw = e.x.astype(np.float64)
    missed = np.isnan(raw).all(axis=1)
    x = _ffill(raw)
    for c in counters:
        x[:, c] = _increments(e.exact.get(c, raw[:, c]))
    for c in deltas:
        x[:, c] = _deltas(raw[:, c])
    return np.column_stack([x, missed]).astype(np.float32)


@dataclass
class Windows:
    """N windows of ``length`` rows over the concatenated, scaled array ``z``."""

    z: torch.Tensor  # (rows, channels)
    end: np.ndarray  # (N,) row of each window's last sample
    future_end: np.ndarray  # (N,) row where the teacher's window ends (closer to failure)
    y: np.ndarray  # (N,) 1 = entity fails within the horizon after this window
    entity: np.ndarray  # (N,) index into the entity list
    t: np.ndarray  # (N,) time of the window's last sample
    length: int

    def batch(self, idx: np.ndarray, future: bool = False) -> torch.Tensor:
        ends = (self.future_end if future else self.end)[idx]
        rows = ends[:, None] - np.arange(self.length - 1, -1, -1)[None, :]
        return self.z[torch.from_numpy(rows)]

    def parts(self, size: int = 65536) -> Iterator[np.ndarray]:
        """All window indices in runs of at most ``size``: scoring a large fleet's windows
        a run at a time bounds the detectors' float64 copies of their inputs."""
        for start in range(0, len(self.end), size):
            yield np.arange(start, min(start + size, len(self.end)))

    def summary(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Per window: last value, window mean, and last-minus-first for each channel;
        the input of the point detectors used as baselines."""
        idx = np.arange(len(self.end)) if idx is None else idx
        c = self.z.shape[1]
        out = np.empty((len(idx), 3 * c), dtype=self.z.numpy().dtype)
        at = 0  # filled in place, as fgl.predict_proba does, so the heap can shrink
        for part in np.array_split(idx, max(1, len(idx) // 4096)):
            w = self.batch(part).numpy()
            rows = out[at : at + len(part)]
            rows[:, :c] = w[:, -1]
            rows[:, c : 2 * c] = w.mean(axis=1)
            rows[:, 2 * c :] = w[:, -1] - w[:, 0]
            at += len(part)
        return out


class Scaler:
    """Standardise channels with statistics of the training entities only."""

    def fit(self, arrays: list[np.ndarray] | np.ndarray) -> Scaler:
        """From a list of per-entity arrays, or from one array of all their rows (the
        same figures, without a second copy of the rows)."""
        a = arrays if isinstance(arrays, np.ndarray) else np.concatenate(arrays)
        self.mu, self.sd = a.mean(axis=0), np.maximum(a.std(axis=0), 1e-6)
        return self

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return ((a - self.mu) / self.sd).astype(np.float32)


def make_windows(
    ents: list[Entity],
    cleaned: Iterable[np.ndarray],
    length: int,
    horizon: float,
    shift: int,
    stride: int = 1,
) -> Windows:
    """Windows ending at every ``stride``-th sample of each entity. Each entity is padded
    in front with its first row so early samples get a window too. The teacher's window
    ends ``shift`` samples later, but never past the entity's last sample.

    ``cleaned`` (one array per entity, as many rows as its ``t``) may be a generator:
    each array is copied into one array allocated up front and can be dropped at once,
    so a large fleet's rows are held once, not once per entity and again joined."""
    sizes = [len(e.t) + length - 1 for e in ents]
    z = None
    ends, fut, ys, ids, ts = [], [], [], [], []
    offset = 0
    for k, (e, x) in enumerate(zip(ents, cleaned, strict=True)):
        n = len(x)
        if n != len(e.t):
            raise ValueError(f"{e.name}: {n} cleaned rows for {len(e.t)} times")
        if z is None:
            z = np.empty((sum(sizes), x.shape[1]), dtype=x.dtype)
        z[offset : offset + length - 1] = x[:1]
        z[offset + length - 1 : offset + sizes[k]] = x
        i = np.arange(n - 1, -1, -stride)[::-1]  # always keep the last sample
        ends.append(offset + length - 1 + i)
        fut.append(offset + length - 1 + np.minimum(i + shift, n - 1))
        ys.append((e.failure_time - e.t[i] <= horizon).astype(np.int64))
        ids.append(np.full(len(i), k))
        ts.append(e.t[i])
        offset += sizes[k]
    if z is None:
        raise ValueError("no entities to make windows of")
    return Windows(
        z=torch.from_numpy(z),
        end=np.concatenate(ends),
        future_end=np.concatenate(fut),
        y=np.concatenate(ys),
        entity=np.concatenate(ids),
        t=np.concatenate(ts),
        length=length,
    )


def counter_columns(ds: PredictionSet, kind: str = "counters") -> list[int]:
    """Channel indices of the cumulative counters (``kind="deltas"``: per-poll ones)."""
    names = ds.notes.get(kind, [])
    return [ds.channels.index(c) for c in names]
