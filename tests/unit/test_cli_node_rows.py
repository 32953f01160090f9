"""`stalwart nodes`: a dead paramserver's role is the last one polled, shown as such
(a dead primary listed as "primary" beside the promoted one read as two primaries)."""

from stalwart.api import common, coordinator
from stalwart.cli.admin import node_row


def _replica(state: int) -> coordinator.Node:
    return coordinator.Node(node_id="ps-0a", role=common.NODE_ROLE_PARAMSERVER, shard=0,
                            replica_role=common.REPLICA_ROLE_PRIMARY, state=state)  # fmt: skip


def test_a_dead_replica_shows_the_role_it_had():
    assert node_row(_replica(coordinator.NODE_STATE_DEAD))[4] == "shard 0 (was primary)"
    assert node_row(_replica(coordinator.NODE_STATE_ALIVE))[4] == "shard 0 primary"
