"""A row whose primary key changes keeps the TOASTed values the change did not touch.

Postgres logs `UPDATE t SET id = id + 1` as one change of the row; Debezium sends it as
a delete of the old key (header `__debezium.newkey`) and a create of the new key
(`__debezium.oldkey`), both at that change's source position. A TOASTed value the update left alone is not in the
WAL (REPLICA IDENTITY DEFAULT), so the create carries Debezium's placeholder (decoded as
null and named in `_unchanged`), and the new key has no row of its own to keep the value
from. The value is the old key's, as it was just before that position.

`fill_moved_values`, for the creates of a batch's key changes that carry a placeholder:
  1. finds the old key: the delete at the create's position in the batch, else the
     tombstone at that position (an earlier batch applied the delete);
  2. takes each missing value from the old key's latest earlier change in the batch that
     carried it,
  3. or from the old key's row in the mirror, if older than the position;
  4. or, before 2 and 3, from the old row an earlier batch saved at that position
     (`rows_moved_away`).
  A key changed twice in one batch (A -> B -> C) is filled one step per round of 2 and 3,
  until a round fills nothing.
`rows_moved_away`, for a key change's delete whose create is not in its batch (Kafka
offsets can split the two): the old row as it was just before the position, from the
batch (after 1-3) or the mirror, saved before the batch's MERGE deletes it, for step 4
of the batch that brings the create.

What stays missing (the old row never reached the lake, e.g. compaction removed it
before a rebuild from offset zero) stays in `_unchanged`: the mirror keeps null there,
and README says which tables need REPLICA IDENTITY FULL.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sync.cdc.decode import ERROR, PROVENANCE, UNCHANGED
from sync.cdc.ordering import later, position_columns
from sync.cdc.types import columns, quoted

KEY_CHANGE_HEADERS = {"d": "__debezium.newkey", "c": "__debezium.oldkey"}  # on each half of a key change
MAX_ROUNDS = 8                        # steps 2-3's bound: a key changed this many times in one batch
ID = ["_topic", "_partition", "_offset"]  # a change's record
POSITION = ["_commit_lsn", "_lsn"]
SAVED_DDL = "_commit_lsn bigint, _lsn bigint, _row string, _applied_at timestamp"
MISSING_VALUES = f"_op = 'c' AND size({UNCHANGED}) > 0"  # a create lacking values: a key change's


def is_key_change(op: Column, headers: Column, half: str) -> Column:
    """Whether a Kafka record (its op and headers) is the delete (`d`) or the create (`c`)
    half of a key change."""
    return (op == half) & F.exists(headers, lambda h: h["key"] == KEY_CHANGE_HEADERS[half])


def fill_moved_values(spark: SparkSession, changes: DataFrame, keys: list[str], path: str,
                      tombstones: DataFrame | None, saved: DataFrame | None) -> DataFrame:
    """`changes` (decoded, one table's batch) with the creates of moved keys given the
    unchanged values of their old key (steps 1-4 above); `path` is the mirror's, `saved`
    its rows moved away."""
    data = _data(changes, keys)
    if saved is not None:  # step 4 first: a chain of key changes in the batch may start there
        schema = T.StructType([f for f in changes.schema.fields if f.name in data])
        rows = saved.dropDuplicates(POSITION).select(*POSITION, F.from_json("_row", schema).alias("row"))
        moved = changes.where(MISSING_VALUES).select(*ID, *POSITION).join(rows, POSITION)
        changes = _fill(changes, moved.select(*ID, *[value for i, c in enumerate(data) for value in (
            F.col("row")[c].alias(f"_lakesync_value_{i}"), F.lit(c).alias(f"_lakesync_found_{i}"))]), data)
    old_key_at = changes.where("_op = 'd'").select(F.struct(*columns(keys)).alias("_lakesync_old_key"), *POSITION)
    if tombstones is not None:
        old_key_at = old_key_at.unionByName(
            tombstones.select(F.struct(*columns(keys)).alias("_lakesync_old_key"), *POSITION))
    # At the creates' positions only, once: the tombstones are read once, not every round.
    creates_at = changes.where(MISSING_VALUES).select(*POSITION)
    # (Distinct: a delete may be both in the batch and, from a replay, a tombstone, and
    # a tombstone appended twice; sync/delta/commit.py.)
    old_key_at = old_key_at.join(creates_at, POSITION, "left_semi").distinct().localCheckpoint()
    mirror = spark.read.format("delta").load(path) if DeltaTable.isDeltaTable(spark, path) else None
    missing_before = None
    for _ in range(MAX_ROUNDS):  # steps 2 and 3, a round per step of a chain
        moves = _moves(changes, old_key_at)
        missing = _missing(moves)
        if missing == 0 or missing == missing_before:
            break
        missing_before = missing
        sources = _batch_rows(changes, keys, data)
        if mirror is not None:
            held = [c for c in data if c in mirror.columns]
            sources = sources.unionByName(_mirror_rows(mirror, keys, held), allowMissingColumns=True)
        changes = _fill(changes, _latest_before(moves, sources, data), data)
    return changes


def rows_moved_away(spark: SparkSession, records: DataFrame, changes: DataFrame, keys: list[str],
                    path: str) -> DataFrame | None:
    """The rows to save for the batch's key-change deletes whose create is not in the
    batch (see above), in SAVED_DDL's columns; None when every create is. `records` are
    the table's Kafka records, `changes` its decoded changes after `fill_moved_values`;
    `path` is the mirror's."""
    sequence = F.get_json_object(F.col("value").cast("string"), "$.payload.source.sequence")
    commit_lsn, lsn = position_columns(sequence)
    op = F.get_json_object(F.col("value").cast("string"), "$.payload.op")
    positions = (records.where(is_key_change(op, F.col("headers"), "d"))
                 .select(commit_lsn.alias("_commit_lsn"), lsn.alias("_lsn")))
    creates = changes.where("_op = 'c'").select(*POSITION)
    deletes = (changes.where("_op = 'd'").join(positions, POSITION, "left_semi").join(creates, POSITION, "left_anti")
               .select(*ID, *POSITION, F.struct(*columns(keys)).alias("_lakesync_old_key")).localCheckpoint())
    if deletes.isEmpty():
        return None
    data = _data(changes, keys)
    sources = _batch_rows(changes, keys, data)
    if DeltaTable.isDeltaTable(spark, path):
        mirror = spark.read.format("delta").load(path)
        held = [c for c in data if c in mirror.columns]
        sources = sources.unionByName(_mirror_rows(mirror, keys, held), allowMissingColumns=True)
    found = _latest_before(deletes, sources, data)
    row = F.to_json(F.struct(*[F.col(f"_lakesync_value_{i}").alias(c) for i, c in enumerate(data)]))
    return (deletes.join(found, ID).select(*POSITION, row.alias("_row"), F.current_timestamp().alias("_applied_at"))
            .localCheckpoint())


def _data(changes: DataFrame, keys: list[str]) -> list[str]:
    return [c for c in changes.columns if c not in keys and c not in PROVENANCE and c not in (UNCHANGED, ERROR)]


def _moves(changes: DataFrame, old_key_at: DataFrame) -> DataFrame:
    """The creates still missing values, each with its old key where it is known;
    checkpointed, as every step reads them."""
    creates = changes.where(MISSING_VALUES).select(*ID, *POSITION, UNCHANGED)
    return creates.join(old_key_at, POSITION).dropDuplicates(ID).localCheckpoint()


def _missing(moves: DataFrame) -> int:
    return moves.select(F.coalesce(F.sum(F.size(UNCHANGED)), F.lit(0))).first()[0]


def _batch_rows(changes: DataFrame, keys: list[str], data: list[str]) -> DataFrame:
    """The batch's changes as sources of values: key, position, values, what they lack."""
    return changes.where("_op != 'd'").select(F.struct(*columns(keys)).alias("_lakesync_key"), *POSITION, "_offset",
                                              *columns(data), UNCHANGED)


def _mirror_rows(mirror: DataFrame, keys: list[str], data: list[str]) -> DataFrame:
    """The mirror's rows as sources of values (a row lacks none; it orders before the batch)."""
    return mirror.select(F.struct(*columns(keys)).alias("_lakesync_key"), *POSITION, F.lit(-1).cast("bigint").alias("_offset"),
                         *columns(data), F.array().cast("array<string>").alias(UNCHANGED))


def _latest_before(moves: DataFrame, sources: DataFrame, data: list[str]) -> DataFrame:
    """Per move (ID, position, `_lakesync_old_key`): each column's value in the latest of `sources`
    of its old key that is older than its position and carried it; `_lakesync_found_<i>`
    names the column where there is one."""
    earlier = later(("m._commit_lsn", "m._lsn"), ("s._commit_lsn", "s._lsn"))
    order = F.struct("s._commit_lsn", "s._lsn", "s._offset")
    joined = moves.alias("m").join(sources.alias("s"), F.expr(f"s._lakesync_key = m._lakesync_old_key AND {earlier}"))
    found = []
    for i, column in enumerate(data):
        carried = ~F.array_contains(F.col(f"s.{UNCHANGED}"), column)
        found.append(F.max_by(F.col(f"s.{quoted(column)}"), F.when(carried, order)).alias(f"_lakesync_value_{i}"))
        found.append(F.max(F.when(carried, F.lit(column))).alias(f"_lakesync_found_{i}"))
    return joined.groupBy(*[F.col(f"m.{c}") for c in ID]).agg(*found).localCheckpoint()


def _fill(changes: DataFrame, fills: DataFrame, data: list[str]) -> DataFrame:
    """`changes` with the values `fills` found (per ID) put in place of the ones the change
    lacked, and those columns taken out of its `_unchanged`."""
    filled = changes.join(fills.alias("f"), ID, "left")
    taken = {}
    for i, column in enumerate(data):
        take = F.array_contains(F.col(UNCHANGED), column) & F.col(f"f._lakesync_found_{i}").isNotNull()
        taken[column] = F.when(take, F.col(f"f._lakesync_value_{i}")).otherwise(F.col(quoted(column))).alias(column)
    found = F.array_compact(F.array(*[F.col(f"f._lakesync_found_{i}") for i in range(len(data))]))
    still = F.array_except(F.col(UNCHANGED), found) if data else F.col(UNCHANGED)
    return filled.select(*[taken.get(c, F.col(quoted(c))) if c != UNCHANGED else still.alias(UNCHANGED)
                           for c in changes.columns]).localCheckpoint()
