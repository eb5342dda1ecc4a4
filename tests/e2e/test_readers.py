"""Any Delta reader (issue 23 item 3): every table Lakesync writes, read by DuckDB's delta
extension (delta-kernel, no Spark, no JVM), holds what Spark reads from it.

Runs last among the end-to-end tests (tests/e2e/conftest.py), when every kind of table
exists: mirrors (with column mapping, one with widened types), the changelog, the ledger
and its balances, the views and the event-time tables. A mirror with deletion vectors:
tests/spark/test_mirror_batch.py (they come with a MERGE copying 100k rows).
"""

import json
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from sync.commands import all_projections
from tests.delta_readers import duckdb_rows, duckdb_with_delta, latest_version, spark_rows
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


def test_duckdb_reads_every_table_as_spark_does(stack, spark):
    # Every projection fresh (each table is compared with Postgres by the tests that wrote
    # it); both readers read one version, as the runner goes on committing (heartbeats).
    lakesync("wait", "--timeout", "600", timeout=660, check=True)
    tables = {(projection.name, target.name): target.table for projection in all_projections(stack)
              for target in projection.targets(stack) if target.delta and DeltaTable.isDeltaTable(spark, target.table)}
    projections = {projection for projection, _ in tables}
    assert {"mirrors", "changelog", "ledger", "views", "event_time"} <= projections, projections
    duck = duckdb_with_delta()
    features = set()
    for name, path in sorted(tables.items()):
        version = latest_version(path)
        assert duckdb_rows(duck, path, version) == spark_rows(spark, path, version), name
        features |= reader_features(path)
    assert {"columnMapping", "typeWidening"} <= features, features  # (the widened mirror of test_schema_changes)


def reader_features(path: str) -> set[str]:
    """The reader features of a table's newest protocol (every commit file is still there:
    the log keeps them 30 days)."""
    protocol = {}
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            protocol = json.loads(line).get("protocol", protocol)
    return set(protocol.get("readerFeatures", []))
