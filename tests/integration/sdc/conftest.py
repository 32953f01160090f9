"""Real processes on loopback, as in tests/integration/trainer (same fixtures)."""

from tests.backends import shm_url  # noqa: F401
from tests.integration.trainer.conftest import (  # noqa: F401 - fixtures and the async hook
    Procs,
    cluster_procs,
    pytest_pyfunc_call,
)
