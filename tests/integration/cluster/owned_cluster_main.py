"""A process that starts a small cluster whose launcher stops with it, prints the
cluster's processes as one JSON line and waits to be killed (test_owned_cluster.py)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from stalwart import cluster


def main(runs_root: str) -> None:
    config = cluster.ClusterConfig(
        coordinators=1, backups=0, spares=0, trainers=1, standbys=0,
        runs_root=Path(runs_root), launcher=True, stop_with_caller=True,
    )  # fmt: skip
    local = cluster.start(config)
    assert local.launcher is not None
    print(json.dumps({
        "members": [m.pid for m in local.members],
        "launcher": local.launcher.pid,
        "store": local.store_url.removeprefix("shm://"),
    }), flush=True)  # fmt: skip
    threading.Event().wait()  # until killed: nothing here stops the cluster


if __name__ == "__main__":
    main(sys.argv[1])
