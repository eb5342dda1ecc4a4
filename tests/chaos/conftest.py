"""The chaos run has its own stack session: `make chaos` (see tests/chaos/test_chaos.py)."""

from tests.e2e.conftest import app_db, db, stack, synced  # noqa: F401  (the same fixtures)
