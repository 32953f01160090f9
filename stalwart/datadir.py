"""Where the shared public data sets are: one rule for every command that reads them."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """Root of the shared data sets: $STALWART_DATA_DIR, else ../shared/data beside the repo."""
    env = os.environ.get("STALWART_DATA_DIR")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data")
