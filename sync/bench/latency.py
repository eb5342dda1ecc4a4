"""Freshness per event: from the Postgres commit to the Delta commit that made it readable.

Every mirror row carries `_source_ts` (the transaction's commit time, from Debezium's
`source.ts_us`) and `_applied_at` (when the batch that wrote it began its MERGE). The
Delta commit that made the row visible is the first version of the table committed at
or after `_applied_at`; its time is the modification time of its log file (the moment
the put-if-absent of `_delta_log/N.json` succeeded). So for each row whose change was
committed inside the measured window: freshness = commit time - `_source_ts`.

A mirror keeps only the latest change of each key, so each row is one event: the last
one of its key. The changelog keeps every event, with `_kafka_ts` (when Connect wrote it
to Kafka): the capture share of the delay, commit -> Kafka, comes from there.
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


def mirror_delays(spark: SparkSession, settings: Settings, start: datetime, end: datetime) -> list[float]:
    """Seconds from commit in Postgres to commit in Delta, per mirror row changed in [start, end)."""
    delays = []
    for table in TABLES:
        path = str(mirror_path(settings, table))
        commits = commit_times(path)
        rows = (spark.read.format("delta").load(path)
                .where((F.col("_source_ts") >= F.lit(start)) & (F.col("_source_ts") < F.lit(end)))
                .select("_source_ts", "_applied_at").collect())
        for row in rows:
            applied = _epoch(row["_applied_at"])
            visible = bisect.bisect_left(commits, applied)
            if visible < len(commits):
                delays.append(commits[visible] - _epoch(row["_source_ts"]))
    return delays


def capture_delays(spark: SparkSession, settings: Settings, start: datetime, end: datetime) -> list[float]:
    """Seconds from commit in Postgres to the record in Kafka, per change event in [start, end)."""
    rows = (spark.read.format("delta").load(changelog_path(settings))
            .where((F.col("_source_ts") >= F.lit(start)) & (F.col("_source_ts") < F.lit(end))
                   & F.col("table").isin([f"public.{t}" for t in TABLES]))
            .select((F.unix_micros("_kafka_ts") - F.unix_micros("_source_ts")).alias("micros")).collect())
    return [row["micros"] / 1e6 for row in rows]


def _epoch(moment: datetime) -> float:
    """PySpark hands timestamps back as naive datetimes in the session zone (UTC here)."""
    return moment.replace(tzinfo=timezone.utc).timestamp() if moment.tzinfo is None else moment.timestamp()
