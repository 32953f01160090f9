"""Log lines go to whatever sys.stderr is when they are written: a harness that swaps
it and closes the old one (pytest's capture does) must not break later lines."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.launcher import ROOT

SCRIPT = textwrap.dedent(
    """
    import io, logging, sys
    import structlog
    from stalwart.log import configure_logging

    configure_logging(service="t")
    first = sys.stderr = io.StringIO()
    structlog.get_logger("x").info("one")
    logging.getLogger("lib").warning("from stdlib one")
    first.close()
    second = sys.stderr = io.StringIO()
    structlog.get_logger("x").info("two")
    logging.getLogger("lib").warning("from stdlib two")
    sys.__stdout__.write(second.getvalue())
    """
)


def test_lines_follow_sys_stderr_after_the_old_one_was_closed() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"event": "two"' in done.stdout and "from stdlib two" in done.stdout, done.stdout
    assert "one" not in done.stdout
