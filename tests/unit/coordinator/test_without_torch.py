"""The coordinator (and the CLI it carries) runs without torch: its image has none.

A fresh interpreter with torch made unimportable loads the coordinator's entry
module and the CLI, and checks a checkpoint manifest's sizes the way the
coordinator's verification does; torch must not be loaded at the end.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torch", "torchgen"):
                raise ImportError(f"{name} is hidden in this test")

    sys.meta_path.insert(0, NoTorch())
    import services.coordinator.__main__  # noqa: F401
    import stalwart.cli.main  # noqa: F401
    from stalwart import checkpoint
    from stalwart.api import common
    from stalwart.errors import StalwartError

    spec = common.TensorSpec(name="w", dtype=common.DTYPE_FLOAT32, shape=[2, 3])
    good = common.CheckpointTensor(spec=spec, chunks=[common.ChunkRef(size=24)])
    checkpoint._check_tensor(good)
    bad = common.CheckpointTensor(spec=spec, chunks=[common.ChunkRef(size=20)])
    try:
        checkpoint._check_tensor(bad)
    except StalwartError as err:
        print("refused:", err.kind.name)
    print("torch loaded:", any(m.split(".")[0] == "torch" for m in sys.modules))
    """
)


def test_coordinator_and_cli_import_no_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["refused: DATA_LOSS", "torch loaded: False"]
