"""Generic mirrors: every table of the captured schema, as a Delta table, with no code per table.

Input:  the compacted topics lakesync.public.<table> (one streaming query subscribes by
        pattern, so a table created while everything runs is picked up by the next batch).
Key:    the table's primary key, from the Kafka record key's schema.
Target: <lake>/mirrors/<table>, columns of the table plus the provenance columns.
Apply:  per table in the batch: decode, latest change per key, MERGE if newer
        (sync/delta/merge.py), committed idempotently (sync/delta/commit.py).
Oracle: SELECT * FROM public.<table> on Postgres.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections import Target
from sync.cdc.decode import decode_changes
from sync.cdc.ordering import parse_sequence
from sync.cdc.types import ColumnType, key_columns, table_columns
from sync.config import CAPTURED_SCHEMA, TOPIC_PREFIX, Settings
from sync.delta.commit import commit_batch
from sync.delta.merge import ensure_table, merge_changes
from sync.progress import Progress

NAME = "mirrors"
KIND = "mirror"
TOPIC_PATTERN = re.escape(f"{TOPIC_PREFIX}.{CAPTURED_SCHEMA}.") + r"[^.]+"
KEYS_PROPERTY = "lakesync.keys"
PROVENANCE_DDL = ("`_commit_lsn` bigint, `_lsn` bigint, `_txid` bigint, `_source_ts` timestamp, "
                  "`_op` string, `_topic` string, `_partition` int, `_offset` bigint, "
                  "`_applied_at` timestamp")


def table_of(topic: str) -> str:
    return topic.rsplit(".", 1)[-1]


def mirror_path(settings: Settings, table: str) -> Path:
    return settings.lake / "mirrors" / table


def targets(settings: Settings) -> list[Target]:
    """A target per mirror in the lake (status lists what exists)."""
    root = settings.lake / "mirrors"
    found = sorted(p.name for p in root.glob("*") if (p / "_delta_log").is_dir()) if root.is_dir() else []
    return [target(settings, table) for table in found]


def target(settings: Settings, table: str) -> Target:
    return Target(name=f"mirror.{table}", kind=KIND, table=str(mirror_path(settings, table)),
                  oracle_sql=f'SELECT * FROM {CAPTURED_SCHEMA}."{table}"',
                  source=f"{CAPTURED_SCHEMA}.{table}")


def verify_targets(settings: Settings, conn) -> list[Target]:
    """Every table of the captured schema in Postgres, and every mirror in the lake."""
    rows = conn.execute(
        "SELECT c.relname, array_agg(a.attname ORDER BY k.ord) FILTER (WHERE a.attname IS NOT NULL) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
        "LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') GROUP BY c.relname", (CAPTURED_SCHEMA,)).fetchall()
    keys = {table: list(columns or []) for table, columns in rows}
    names = sorted(set(keys) | {t.name.split(".", 1)[1] for t in targets(settings)})
    return [replace(target(settings, table), keys=keys.get(table, [])) for table in names]


def lag_of(target: Target, lag_by_topic: dict[str, int]) -> int:
    return lag_by_topic.get(f"{TOPIC_PREFIX}.{target.source}", 0)


def start(spark: SparkSession, settings: Settings, once: bool) -> StreamingQuery:
    records = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
               .option("subscribePattern", TOPIC_PATTERN)
               .option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
               .load())
    apply = MirrorBatch(settings)
    writer = (records.writeStream.queryName(NAME)
              .option("checkpointLocation", str(settings.checkpoints / NAME))
              .foreachBatch(apply))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{settings.trigger_seconds} seconds")
    return writer.start()


class MirrorBatch:
    """foreachBatch function: applies one micro-batch to every table it touches."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.progress = Progress(settings, NAME)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession  # this query's own session (its txn tags stay here)
        started = time.time()
        records = batch.where(F.col("value").isNotNull()).persist()
        try:
            applied = {}
            for table in self._tables(records):
                applied[table["name"]] = self._apply_table(spark, records, table, batch_id)
            self.progress.record(batch_id, applied, started)
        finally:
            records.unpersist()

    def _tables(self, records: DataFrame) -> list[dict]:
        """Per topic in the batch: latest value and key schema, latest truncate position."""
        value = F.col("value").cast("string")
        key = F.col("key").cast("string")
        is_truncate = F.get_json_object(value, "$.payload.op") == "t"
        rows = (records.groupBy("topic").agg(
            F.max_by(F.get_json_object(value, "$.schema"), "offset").alias("value_schema"),
            # A truncate's key is its topic (connectors/: KeyTruncateEvents), not the table's key.
            F.max_by(F.get_json_object(key, "$.schema"),
                     F.when(F.col("key").isNotNull() & ~is_truncate, F.col("offset"))).alias("key_schema"),
            F.max_by(F.get_json_object(value, "$.payload.source.sequence"),
                     F.when(is_truncate, F.col("offset"))).alias("truncate_sequence"),
        ).collect())
        return [{"name": table_of(r["topic"]), "topic": r["topic"],
                 "columns": table_columns(json.loads(r["value_schema"])),
                 "keys": key_columns(json.loads(r["key_schema"])) if r["key_schema"] else None,
                 "truncated_at": parse_sequence(r["truncate_sequence"])} for r in rows]

    def _apply_table(self, spark: SparkSession, records: DataFrame, table: dict, batch_id: int) -> int:
        path = str(mirror_path(self.settings, table["name"]))
        columns: list[ColumnType] = table["columns"]
        ddl = ", ".join([c.ddl() for c in columns] + [PROVENANCE_DDL])
        keys = table["keys"]
        if keys is None:  # only truncates in this batch: the key is the one the mirror recorded
            if not DeltaTable.isDeltaTable(spark, path):
                return 0  # a table we never mirrored was truncated: nothing to remove
            keys = [k for k in DeltaTable.forPath(spark, path).detail().first()["properties"]
                    .get(KEYS_PROPERTY, "").split(",") if k]
        if not keys:
            raise ValueError(f"table {table['name']} has no primary key; mirrors need one")
        target_table = ensure_table(spark, path, ddl, {KEYS_PROPERTY: ",".join(keys)})
        changes = decode_changes(records.where(F.col("topic") == table["topic"]), columns)
        metrics = {}

        def write() -> None:
            result = merge_changes(target_table, changes, keys, table["truncated_at"])
            metrics.update(result)

        commit_batch(spark, f"{NAME}:{table['name']}", batch_id, write, self.settings.fault)
        return int(metrics.get("num_affected_rows", 0))
