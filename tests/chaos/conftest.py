"""The chaos run has a stack of its own (`make chaos`): another home and other ports, so
it never meets the end-to-end session's stack, even when both run at once. Its topics
have four partitions (LAKESYNC_TOPIC_PARTITIONS): the faults then also meet changes of
one source transaction spread over partitions, read and held apart."""

import os

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
