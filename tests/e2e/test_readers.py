"""Any Delta reader (issue 23 item 3): every table Lakesync writes, read by DuckDB's delta
extension (delta-kernel, no Spark, no JVM), holds what Spark reads from it.

Runs last among the end-to-end tests (tests/e2e/conftest.py), when every kind of table
exists: mirrors (column mapping), the changelog, the ledger and its balances, the views
and the event-time tables. A mirror with deletion vectors (they come with a MERGE copying
100k rows) and one with a widened column (the lost-slot test's resnapshot recreates the
mirrors before this test): tests/spark/test_mirror_batch.py.
"""

import pytest
from delta.tables import DeltaTable

from sync.commands import all_projections
from sync.delta import reader
from sync.delta.merge import latest_version
from tests.delta_readers import duckdb_rows, reader_features, spark_rows
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
    duck = reader.connect()
    features = set()
    for name, path in sorted(tables.items()):
        version = latest_version(path)
        assert duckdb_rows(duck, path, version) == spark_rows(spark, path, version), name
        features |= reader_features(path)
    assert "columnMapping" in features, features

