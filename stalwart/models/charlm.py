"""``char-lm``: a small causal transformer over the bytes of Python's own standard library.

Text every machine with Python has, no download: the source of a fixed list of
standard-library modules, read from the running interpreter's ``lib``
directory and joined in that order. Trainers and the reference run must
therefore run the same Python version (the files differ between versions);
the task's ``corpus_crc`` says which text it trained on.

The model exercises what users bring: token and position embeddings,
pre-norm transformer blocks (LayerNorm, causal self-attention, dropout 0.1),
and it is meant for AdamW with warmup + cosine, clipping and micro-batches
(its default spec). The last 10 % of the bytes are held out; ``evaluate``
reports the mean cross-entropy in nats per byte on fixed held-out windows, and
the loss of the training bytes' unigram distribution on them for comparison.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from stalwart import modelargs
from stalwart.models.base import generator, seeded_module

NAME = "char-lm"
MODULES = (
    "textwrap.py", "string.py", "glob.py", "fnmatch.py", "shlex.py",
    "bisect.py", "heapq.py", "calendar.py", "argparse.py",
)  # fmt: skip
HELD_OUT = 0.1
EVAL_WINDOWS = 96
VOCAB = 256  # bytes


@functools.lru_cache(maxsize=1)
def corpus() -> torch.Tensor:
    """The joined source bytes as int64 token ids."""
    lib = Path(os.__file__).parent
    try:
        data = b"\n".join((lib / name).read_bytes() for name in MODULES)
    except OSError as exc:
        raise modelargs.invalid(
            f"{NAME}: cannot read the standard library's sources: {exc}"
        ) from exc
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)


def corpus_crc() -> int:
    return zlib.crc32(corpus().to(torch.uint8).numpy().tobytes())


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.norm2(x)))


class CharTransformer(nn.Module):
    def __init__(self, context: int, dim: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim)
        self.positions = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)
        h = self.drop(self.tokens(x) + self.positions(pos))
        # True above the diagonal: a position attends to itself and the past only
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.norm(h))


class CharLmTask:
    """model_args: ``context`` (64), ``dim`` (64), ``layers`` (2), ``heads`` (4), ``dropout_pct`` (10)."""

    def __init__(self, seed: int, model_args: Mapping[str, str]):
        args = modelargs.parse(NAME, model_args)
        self.context, self.dim = args["context"], args["dim"]
        self.layers, self.heads = args["layers"], args["heads"]
        self.dropout = args["dropout_pct"] / 100
        self.seed = seed

    def build_model(self, seed: int) -> nn.Module:
        return seeded_module(
            seed,
            lambda: CharTransformer(self.context, self.dim, self.layers, self.heads, self.dropout),
        )

    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = corpus()
        cut = int(len(data) * (1 - HELD_OUT))
        return data[:cut], data[cut:]

    def _windows(self, data: torch.Tensor, starts: torch.Tensor):
        idx = starts.unsqueeze(1) + torch.arange(self.context + 1)
        chunk = data[idx]
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def batch(self, seed: int, slot: int, step: int, batch_size: int):
        train, _ = self._split()
        g = generator(seed, slot, step)
        starts = torch.randint(len(train) - self.context - 1, (batch_size,), generator=g)
        return self._windows(train, starts)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        train, held = self._split()
        g = generator(self.seed, NAME, "eval")
        starts = torch.randint(len(held) - self.context - 1, (EVAL_WINDOWS,), generator=g)
        x, y = self._windows(held, starts)
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(x.to(device)).reshape(-1, VOCAB)
            target = y.reshape(-1).to(device)
            loss = nn.functional.cross_entropy(logits, target).item()
            accuracy = (logits.argmax(dim=1) == target).float().mean().item()
        model.train(was_training)
        counts = torch.bincount(train, minlength=VOCAB).double() + 1.0  # add-one smoothing
        unigram = -(counts / counts.sum()).log()[y.reshape(-1)].mean().item()
        return {"loss": loss, "accuracy": accuracy, "unigram_loss": unigram,
                "examples": float(y.numel())}  # fmt: skip
