"""Silent-data-corruption helpers shared by trainers and the coordinator (no I/O).

- :func:`gradient_crc32c`: the fingerprint two trainers compare when they
  computed the same slot batch. Gradients are bitwise reproducible (DESIGN.md
  invariant 4), so equal inputs give equal fingerprints and any difference is
  corruption, not rounding.
- :func:`is_sampled`: which (job, step, slot) batches are computed twice. A pure
  function of its arguments, so the trainer holding the slot and the coordinator
  agree without a message.
- :func:`flip_bit`: the test-only corruption the trainer's fault hook injects.
- :data:`DETECTIONS`: ``stalwart_sdc_detections_total{source}``, counted where the
  corruption is caught; :data:`SOURCES` are the detectors, the same words the
  ReportCorruption RPC takes as ``kind``.

torch is imported inside the functions that need it: the coordinator uses the
sampling and the counter and should not pay torch's import time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import google_crc32c
from prometheus_client import Counter

SOURCES = ("crc", "abft", "fingerprint", "duplicate_compute", "nonfinite")
DETECTIONS = Counter(
    "stalwart_sdc_detections_total",
    "Silent data corruption caught, by what caught it; nothing caught is ever applied.",
    ["source"],
)
for _source in SOURCES:  # every series from the first scrape
    DETECTIONS.labels(_source)

if TYPE_CHECKING:
    import torch

# Sampling resolution: rates are compared against a 53-bit uniform value.
_UNIT = float(1 << 53)


def gradient_crc32c(grads: Mapping[str, torch.Tensor]) -> int:
    """CRC32C over every tensor's name, shape, dtype and bytes, in name order."""
    import torch

    crc = 0
    for name in sorted(grads):
        t = grads[name].detach().to("cpu").contiguous()
        header = f"{name}|{tuple(t.shape)}|{t.dtype}|".encode()
        # one copy (the C extension reads bytes only), extended in place: no concatenation
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        crc = google_crc32c.extend(google_crc32c.extend(crc, header), data)
    return crc


def is_sampled(job_id: str, seed: int, step: int, slot: int, rate: float) -> bool:
    """True when slot ``slot``'s batch of ``step`` is computed twice (rate in [0, 1])."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    digest = hashlib.blake2b(f"dup|{job_id}|{seed}|{step}|{slot}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "little") >> 11) / _UNIT
    return u < rate


def flip_bit(grads: Mapping[str, torch.Tensor], bit: int = 22) -> str:
    """Flip one bit of the first element of the first gradient (name order), in place.

    Bit 22 is a float32's highest mantissa bit: the value changes by up to half
    but stays finite, so only a comparison (not the non-finite check) can see it.
    Returns the tensor's name.
    """
    import torch

    name = sorted(grads)[0]
    flat = grads[name].view(-1)
    if flat.dtype != torch.float32:
        raise ValueError("flip_bit handles float32 gradients")
    as_int = flat[:1].view(torch.int32)
    as_int ^= 1 << bit
    return name
