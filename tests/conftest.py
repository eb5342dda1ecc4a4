"""Test session set-up shared by every test folder.

The tests get their own embedded stack (LAKESYNC_HOME=.stack-test, ports apart from a
developer's demo stack), set here before anything reads the configuration.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_ENV = {
    "LAKESYNC_HOME": str(ROOT / ".stack-test"),
    "LAKESYNC_PG_DSN": "postgresql://lakesync_admin@127.0.0.1:25432/lakesync",
    "LAKESYNC_KAFKA_BOOTSTRAP": "127.0.0.1:29092",
    "LAKESYNC_CONNECT_URL": "http://127.0.0.1:28083",
    "LAKESYNC_SEARCH_URL": "http://127.0.0.1:29200",
    "LAKESYNC_METRICS_PORT": "29400",
    "LAKESYNC_SPARK_DRIVER_MEMORY": "2g",
    "LAKESYNC_SHUFFLE_PARTITIONS": "2",
    "TZ": "UTC",
}
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)
os.environ.pop("PGPASSFILE", None)  # the test stack's own pgpass, set by config.load()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (Delta enabled) for every test that needs one."""
    import time

    from sync import config
    from sync.streaming import spark as spark_session

    time.tzset()
    session = spark_session.session(config.load(), "lakesync-tests")
    yield session
    session.stop()
