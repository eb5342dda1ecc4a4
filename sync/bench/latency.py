"""Freshness per event: from the Postgres commit to the Delta commit that made it readable.

Every row a projection writes carries `_source_ts` (the transaction's commit time, from
Debezium's `source.ts_us`) and `_applied_at` (when the batch that wrote it began its
write). The Delta commit that made the row visible is the first version of the table
committed at or after `_applied_at`; its time is the modification time of its log file
(the moment the put-if-absent of `_delta_log/N.json` succeeded). So for each row whose
change was committed inside the measured window: freshness = commit time - `_source_ts`.

Two views of it, taken right after the window (before any later load overwrites a row):
  - the changelog keeps every event: the freshness of each one, and the capture share of
    it (`_kafka_ts`, when Connect wrote it to Kafka, minus `_source_ts`);
  - a mirror keeps only the latest change of each key: the freshness of what readers of
    the mirrors see, one sample per key (its last event in the window).
"""

from __future__ import annotations

import bisect
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from projections.changelog import changelog_path
from projections.mirrors import mirror_path
from sync.config import Settings

TABLES = ["orders", "order_items", "customers", "products"]


def commit_times(table: str) -> list[float]:
    """The commit time (epoch seconds) of every version of a Delta table, in version order."""
    log = Path(table) / "_delta_log"
    return sorted(p.stat().st_mtime for p in log.glob("[0-9]*.json"))


def delays(spark: SparkSession, path: str, start: datetime, end: datetime, where=None) -> list[float]:
    """Seconds from commit in Postgres to commit in Delta, per row of the table at `path`
    whose change was committed in [start, end)."""
    commits = commit_times(path)
    rows = spark.read.format("delta").load(path).where(
        (F.col("_source_ts") >= F.lit(start)) & (F.col("_source_ts") < F.lit(end)))
    if where is not None:
        rows = rows.where(where)
    found = []
    for row in rows.select("_source_ts", "_applied_at").toLocalIterator():
        visible = bisect.bisect_left(commits, _epoch(row["_applied_at"]))
        if visible < len(commits):
            found.append(commits[visible] - _epoch(row["_source_ts"]))
    return found


def mirror_delays(spark: SparkSession, settings: Settings, start: datetime, end: datetime) -> list[float]:
    return [d for table in TABLES for d in delays(spark, str(mirror_path(settings, table)), start, end)]


def changelog_delays(spark: SparkSession, settings: Settings, start: datetime, end: datetime) -> list[float]:
    return delays(spark, changelog_path(settings), start, end, _captured())


def capture_delays(spark: SparkSession, settings: Settings, start: datetime, end: datetime) -> list[float]:
    """Seconds from commit in Postgres to the record in Kafka, per change event in [start, end)."""
    rows = (spark.read.format("delta").load(changelog_path(settings))
            .where((F.col("_source_ts") >= F.lit(start)) & (F.col("_source_ts") < F.lit(end)) & _captured())
            .select((F.unix_micros("_kafka_ts") - F.unix_micros("_source_ts")).alias("micros")).collect())
    return [row["micros"] / 1e6 for row in rows]


def _captured():
    return F.col("table").isin([f"public.{t}" for t in TABLES])


def _epoch(moment: datetime) -> float:
    """PySpark hands timestamps back as naive datetimes in the session zone (UTC here)."""
    return moment.replace(tzinfo=timezone.utc).timestamp() if moment.tzinfo is None else moment.timestamp()
