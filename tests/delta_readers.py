"""The rows of a table as DuckDB's delta extension (sync/delta/reader.py: delta-kernel, no
Spark, no JVM) and Spark read them, comparable."""

import json
from collections import Counter
from pathlib import Path

import duckdb

from sync.compare import plain_value
from sync.delta import reader


def _rows(dicts) -> Counter:
    return Counter(json.dumps({c: plain_value(v) for c, v in row.items()}, sort_keys=True) for row in dicts)


def reader_features(path: str) -> set[str]:
    """The reader features of the table's newest protocol."""
    protocol = {}
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            protocol = json.loads(line).get("protocol", protocol)
    return set(protocol.get("readerFeatures", []))


def duckdb_rows(connection: duckdb.DuckDBPyConnection, path: str, version: int) -> Counter:
    """The table's rows at `version` as DuckDB reads them (through Arrow: its own
    conversion of a timestamp with time zone needs pytz)."""
    return _rows(connection.execute("SELECT * FROM delta_scan(?, version => ?)",
                                    [reader.scan(connection, path), version])
                 .to_arrow_table().to_pylist())


def spark_rows(spark, path: str, version: int) -> Counter:
    frame = spark.read.format("delta").option("versionAsOf", version).load(path)
    return _rows(row.asDict(recursive=False) for row in frame.collect())
