"""A stand-in service for the launcher tests: it starts a child (a data loader worker
would be one) in its own process group, writes the ready file with the child's pid,
and waits to be killed.

Run: python -m tests.integration.cluster.group_child_service --port 0 --ready-file r.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", default="0")
    parser.add_argument("--ready-file", type=Path, required=True)
    opts, _ = parser.parse_known_args()
    child = subprocess.Popen(["sleep", "3600"])  # same session and group as this process
    tmp = opts.ready_file.with_name(f".{opts.ready_file.name}.tmp")
    tmp.write_text(json.dumps({"address": "127.0.0.1:0", "child": child.pid,
                               "pgid": os.getpgid(0), "sid": os.getsid(0)}))  # fmt: skip
    tmp.replace(opts.ready_file)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
