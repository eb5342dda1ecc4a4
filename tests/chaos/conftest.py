"""The chaos run has a stack of its own (`make chaos`): another home and other ports, so
it never meets the end-to-end session's stack, even when both run at once. Its topics
have four partitions (LAKESYNC_TOPIC_PARTITIONS): the faults then also meet changes of
one source transaction spread over partitions, read and held apart. Its lake is in a
bucket of an S3-compatible server (moto's: tests/object_store.py), so every table,
checkpoint, fencing epoch and consistent point is written through S3A and sync/lake.py
while the runner is killed mid-batch."""

import os

import pytest

from sync.config import ROOT

os.environ.update({
    "LAKESYNC_HOME": str(ROOT / ".stack-chaos"),
    "LAKESYNC_PG_DSN": "postgresql://lakesync_admin@127.0.0.1:24432/lakesync",
    "LAKESYNC_KAFKA_BOOTSTRAP": "127.0.0.1:24092",
    "LAKESYNC_CONNECT_URL": "http://127.0.0.1:24083",
    "LAKESYNC_SEARCH_URL": "http://127.0.0.1:24200",
    "LAKESYNC_METRICS_PORT": "24400",
    "LAKESYNC_SPARK_MASTER_PORT": "24077",
    "LAKESYNC_TOPIC_PARTITIONS": "4",
})

from tests.e2e.conftest import app_db, db, stack, synced  # noqa: E402,F401  (the same fixtures)

LAKE = "s3a://lake/chaos"


@pytest.fixture(scope="session", autouse=True)
def lake_in_a_bucket(object_store):
    """Before the stack (an autouse fixture comes first): the lake, for the commands run
    and the test's own settings and Spark session."""
    os.environ["LAKESYNC_LAKE"] = LAKE
    yield
    os.environ.pop("LAKESYNC_LAKE", None)
