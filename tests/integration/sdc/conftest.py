"""Real processes on loopback, as in tests/integration/trainer (same fixtures)."""

from tests.backends import shm_url  # noqa: F401
from tests.integration.trainer.conftest import Procs, cluster_procs  # noqa: F401 - fixtures
