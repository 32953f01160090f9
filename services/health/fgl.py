"""Future-Guided Learning (FGL) for failure prediction, and the LSTM baseline.

FGL (Gunasekaran et al., Nature Communications 2025, arXiv 2410.15217) trains two models:

- the *teacher* sees the window that ends ``shift`` samples later, closer to the failure,
  so precursors are plainer to it. It is trained on the same labels, then frozen;
- the *student* sees only the window a deployed model would see, and learns from the
  labels (cross-entropy) and from the teacher's softened output on the matching future
  window (temperature-scaled KL divergence). Only the student is deployed.

The LSTM baseline is the student's architecture trained on cross-entropy alone, with the
same windows, seed, epochs and optimiser, so any difference is what the teacher adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from services.health.windows import Windows


class LSTMClassifier(nn.Module):
    """One LSTM layer over the window, a linear head on the last hidden state.

    Each step sees its channels and their change since the window began: modules differ
    in their healthy levels, so a fall from -1 to -4 dBm matters while a steady -4 dBm
    does not. Inputs are clipped because counter bursts reach tens of standard
    deviations and would saturate the gates."""

    def __init__(self, n_in: int, hidden: int = 32, clip: float = 8.0):
        super().__init__()
        self.clip = clip
        self.lstm = nn.LSTM(2 * n_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(-self.clip, self.clip)
        _, (h, _) = self.lstm(torch.cat([x, x - x[:, :1]], dim=2))
        return self.head(h[-1])


@dataclass
class TrainConfig:
    hidden: int = 32
    epochs: int = 8
    lr: float = 3e-3
    batch: int = 256
    temperature: float = 2.0  # softens the teacher so its uncertainty carries over
    alpha: float = 0.5  # weight of the distillation term against cross-entropy
    seed: int = 0
    # Weight failing windows up to the weight of all the others (None: the data set's
    # setting in eval_prediction.SETTINGS, else True).
    balanced: bool | None = None


def _class_weights(y: np.ndarray, balanced: bool | None = True) -> torch.Tensor:
    # Failures are the minority; balancing weights them so the loss does not ignore them.
    if balanced is False:
        return torch.ones(2)
    pos = max(int(y.sum()), 1)
    return torch.tensor([1.0, (len(y) - pos) / pos], dtype=torch.float32)


def _fit(
    model: nn.Module,
    w: Windows,
    idx: np.ndarray,
    cfg: TrainConfig,
    future: bool = False,
    soft: torch.Tensor | None = None,
) -> nn.Module:
    """Train ``model`` on windows ``idx``; with ``soft`` (teacher probabilities at
    temperature, aligned with ``idx``) the loss adds the distillation term."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    y = torch.from_numpy(w.y[idx])
    weights = _class_weights(w.y[idx], cfg.balanced)
    model.train()
    for _ in range(cfg.epochs):
        for part in torch.randperm(len(idx), generator=gen).split(cfg.batch):
            logits = model(w.batch(idx[part.numpy()], future=future))
            loss = F.cross_entropy(logits, y[part], weight=weights)
            if soft is not None:
                log_p = F.log_softmax(logits / cfg.temperature, dim=1)
                kd = F.kl_div(log_p, soft[part], reduction="batchmean")
                # T^2 keeps the distillation gradients on the same scale as the CE ones.
                loss = (1 - cfg.alpha) * loss + cfg.alpha * cfg.temperature**2 * kd
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model


def predict_proba(
    model: nn.Module,
    w: Windows,
    idx: np.ndarray | None = None,
    future: bool = False,
    temperature: float = 1.0,
) -> np.ndarray:
    """Probability of "fails within the horizon" for windows ``idx`` (all by default)."""
    idx = np.arange(len(w.end)) if idx is None else idx
    # One output array, filled batch by batch: a list of per-batch results would keep
    # small blocks alive between the batches' large freed ones, so the heap could only
    # grow (glibc returns memory from its top alone).
    out = np.empty(len(idx), dtype=np.float32)
    at = 0
    with torch.no_grad():
        for part in np.array_split(idx, max(1, len(idx) // 4096)):
            logits = model(w.batch(part, future=future)) / temperature
            out[at : at + len(part)] = torch.softmax(logits, dim=1)[:, 1].numpy()
            at += len(part)
    return out


def train_lstm(w: Windows, idx: np.ndarray, cfg: TrainConfig) -> nn.Module:
    torch.manual_seed(cfg.seed)
    return _fit(LSTMClassifier(w.z.shape[1], cfg.hidden), w, idx, cfg)


def train_fgl(w: Windows, idx: np.ndarray, cfg: TrainConfig) -> tuple[nn.Module, nn.Module]:
    """Returns (teacher, student). The teacher is trained on future windows and frozen
    before the student sees its outputs."""
    torch.manual_seed(cfg.seed)
    teacher = _fit(LSTMClassifier(w.z.shape[1], cfg.hidden), w, idx, cfg, future=True)
    for p in teacher.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        p1 = torch.from_numpy(
            predict_proba(teacher, w, idx, future=True, temperature=cfg.temperature)
        )
    soft = torch.stack([1 - p1, p1], dim=1)
    torch.manual_seed(cfg.seed)
    student = _fit(LSTMClassifier(w.z.shape[1], cfg.hidden), w, idx, cfg, soft=soft)
    return teacher, student
