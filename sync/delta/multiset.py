"""Apply a batch of changes to a table without a primary key: its rows as a multiset.

Such a table's rows have no identity but their values (two equal rows are two copies of
one value), and its changes carry the whole old row (REPLICA IDENTITY FULL, set by
migrations/0005). Its records reach Kafka under keys of their own (KeyKeylessRecords,
jvm/smt), recognised by `is_keyless` (sync/cdc/decode.py). A batch is applied in three
steps:
1. Each change becomes signed rows: a create or snapshot read adds its new row, a delete
   removes its old row, an update does both. Changes older than the table's latest
   truncate are dropped.
2. Per value, within the batch: each removal cancels an addition of the same value; the
   additions left (the latest ones) are inserted, and the removals left over take that
   many copies out of the mirror (its oldest copies of that value).
3. One MERGE on the mirror rows' provenance (`_topic`, `_partition`, `_offset`: the
   record that wrote each row, so unique): the copies chosen in 2 are deleted, the
   additions inserted, and a truncate in the batch removes every row older than it. A
   batch that removes nothing is an append. One commit either way, so a replay skips
   it whole.
A value is identified by a SHA-256 of its columns as JSON, in the mirror's column types
(a widened decimal must hash as the mirror holds it).
"""

from __future__ import annotations

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sync.cdc.decode import BEFORE, PROVENANCE, UNCHANGED
from sync.cdc.ordering import newer_than_literal
from sync.cdc.types import quoted

ROW_IDENTITY = ["_topic", "_partition", "_offset"]  # the record that wrote a mirror row
VALUE = "_lakesync_value"  # hash of a row's columns
SIGN = "_lakesync_sign"    # +1 adds the row, -1 removes one copy of it


def _value_hash(columns: list[str], types: dict) -> Column:
    return F.sha2(F.to_json(F.struct(*[F.col(quoted(c)).cast(types[c]).alias(c) for c in columns])), 256)


def signed_rows(changes: DataFrame, target: DeltaTable) -> DataFrame:
    """Step 1, for changes decoded with `before` (and already past the truncate)."""
    types = {f.name: f.dataType for f in target.toDF().schema.fields}
    data = [c for c in changes.columns if c not in PROVENANCE and c not in (UNCHANGED, BEFORE)]
    provenance = [F.col(c) for c in PROVENANCE]
    added = changes.where(F.col("_op").isin("c", "r", "u")).select(
        *[F.col(quoted(c)) for c in data], *provenance, F.lit(1).alias(SIGN))
    deleted = changes.where(F.col("_op") == "d").select(
        *[F.col(quoted(c)) for c in data], *provenance, F.lit(-1).alias(SIGN))
    replaced = changes.where(F.col("_op") == "u").select(
        *[F.col(BEFORE)[c].alias(c) for c in data], *provenance, F.lit(-1).alias(SIGN))
    return added.unionByName(deleted).unionByName(replaced).withColumn(VALUE, _value_hash(data, types))


def additions(signed: DataFrame) -> DataFrame:
    """Step 2's inserts: per value, the latest additions the batch's removals leave."""
    per_value = Window.partitionBy(VALUE)
    latest_first = per_value.orderBy(F.col(SIGN).desc(), F.col("_commit_lsn").desc(), F.col("_lsn").desc(),
                                     F.col("_offset").desc())
    # Window values go to columns first: Spark allows no window function in a filter.
    return (signed.withColumn("_lakesync_kept", F.sum(SIGN).over(per_value))
            .withColumn("_lakesync_rank", F.row_number().over(latest_first))
            .where((F.col(SIGN) > 0) & (F.col("_lakesync_rank") <= F.col("_lakesync_kept")))
            .drop("_lakesync_kept", "_lakesync_rank", SIGN, VALUE).withColumn("_applied_at", F.current_timestamp()))


def copies_removed(signed: DataFrame, target: DeltaTable) -> DataFrame:
    """Step 2's deletes: per value, as many of the mirror's copies (oldest first) as the
    batch removes beyond its own additions; their ROW_IDENTITY."""
    data = [c for c in signed.columns if c not in PROVENANCE and c not in (SIGN, VALUE)]
    types = {f.name: f.dataType for f in target.toDF().schema.fields}
    excess = (signed.groupBy(VALUE).agg(F.sum(-F.col(SIGN)).alias("_lakesync_excess")).where("_lakesync_excess > 0"))
    oldest_first = Window.partitionBy(VALUE).orderBy("_commit_lsn", "_lsn", "_offset")
    return (target.toDF().withColumn(VALUE, _value_hash(data, types))
            .join(F.broadcast(excess), VALUE)
            .withColumn("_lakesync_rank", F.row_number().over(oldest_first))
            .where(F.col("_lakesync_rank") <= F.col("_lakesync_excess"))
            # Checkpointed: a MERGE source that reads its own target cannot be resolved.
            .select(*ROW_IDENTITY).localCheckpoint())


def merge_multiset(target: DeltaTable, added: DataFrame, removed: DataFrame,
                   truncated_at: tuple[int, int] | None) -> DeltaMergeBuilder:
    """Step 3: deletes the rows `removed` names, inserts `added`, for the batch's commit to
    execute (sync/delta/commit.py `merge`)."""
    source = (added.withColumn(SIGN, F.lit(1))
              .unionByName(removed.withColumn(SIGN, F.lit(-1)), allowMissingColumns=True))
    on = " AND ".join(f"t.{c} = s.{c}" for c in ROW_IDENTITY) + f" AND s.{SIGN} < 0"
    written = added.columns
    merge = (target.alias("t").merge(source.alias("s"), on)
             .whenMatchedDelete()
             .whenNotMatchedInsert(condition=f"s.{SIGN} > 0",
                                   values={quoted(c): F.col(f"s.{quoted(c)}") for c in written}))
    if truncated_at is not None:
        merge = merge.whenNotMatchedBySourceDelete(condition=f"NOT {newer_than_literal(truncated_at, side='t')}")
    return merge
