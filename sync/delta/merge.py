"""Apply a batch of changes to a keyed Delta table: latest per key, only if newer.

1. Drop what can no longer apply: a change older than the table's latest truncate, or
   older than its key's tombstone (the key was deleted after that change happened).
2. Within the batch, keep the latest change per key by source position; a column the
   latest change did not carry (an unchanged TOASTed value) takes its value from the
   latest earlier change in the batch that did, else keeps the target's.
3. MERGE on the key: a newer delete deletes, a newer upsert updates, an unseen key is
   inserted; a change that is not newer than the row is ignored (redeliveries, replays).
   A table with no rows yet takes the batch as an append instead (`inserts`): same rows.
   A truncate in the batch also removes every target row older than it.
4. Record the batch's deletes as tombstones (key and source position) in a side table,
   so the table itself holds only live rows and readers need no filter. Appended, not
   merged (a key's latest tombstone is its highest position; an append costs a tenth
   of a MERGE here), at least once (a replay's copy of a tombstone changes nothing).
   Step 1 reads them only for a batch holding a change older than the newest one (a
   redelivery): a live stream's changes come after every delete before them.
   Tombstones are removed after a horizon (LAKESYNC_TOMBSTONE_HOURS) longer than the
   time Kafka keeps a deleted key's older records in a compacted topic
   (delete.retention.ms, 1 day).
Delta skips a target file only by conjuncts of the merge condition on the target alone
(its min/max statistics per file); the keys' equality is not one. So the condition also
carries the batch's keys as a few ranges of the first key column (`Extent`): MERGE
then reads only the files whose key range meets one of them, the tombstones likewise.
Recent rows change and old ones are deleted, so a batch's keys mostly fall in a few
narrow ranges even in a large table. With a truncate in the batch
(`whenNotMatchedBySource`) MERGE joins every file whole whatever the condition holds
(delta-io/delta#7362), and gets no ranges.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sync import lake
from sync.cdc.decode import PROVENANCE, UNCHANGED
from sync.cdc.ordering import Position, later, newer_than, newer_than_literal
from sync.cdc.types import columns, quoted
from sync.lake import LakePath
from sync.streaming.spark import expressions

DELETION_VECTORS = "delta.enableDeletionVectors"
TABLE_PROPERTIES = {
    # Every table starts without deletion vectors; a keyed table takes them on once a MERGE
    # copies many rows (`deletion_vectors_if_copying`).
    DELETION_VECTORS: "false",
    "delta.enableChangeDataFeed": "false",
    "delta.autoOptimize.optimizeWrite": "false",
}


def latest_per_key(changes: DataFrame, keys: list[str]) -> DataFrame:
    """One change per key: the one with the highest (commit LSN, change LSN, offset)."""
    aggregates, selected = _latest_per_key(tuple(keys), tuple(changes.columns))
    return changes.groupBy(*columns(keys)).agg(*aggregates).select(*selected)


@expressions
def _latest_per_key(keys: tuple[str, ...], names: tuple[str, ...]) -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """latest_per_key's aggregates and output columns for a table's keys and columns."""
    order = F.struct("_commit_lsn", "_lsn", "_offset")
    data = [c for c in names if c not in keys and c not in PROVENANCE and c != UNCHANGED]
    aggregates = [F.max_by(F.struct(*PROVENANCE), order).alias("_lakesync_latest")]
    for column in data:
        # max_by skips rows whose ordering is null: only changes that carried the value.
        carried = (F.col("_op") != "d") & ~F.array_contains(F.col(UNCHANGED), column)
        aggregates.append(F.max_by(F.col(quoted(column)), F.when(carried, order)).alias(column))
        aggregates.append(F.max(F.when(carried, F.lit(True))).alias(f"_lakesync_carried_{column}"))
    unchanged = F.array_compact(F.array(*[F.when(F.col(quoted(f"_lakesync_carried_{c}")).isNull(), F.lit(c)) for c in data]))
    return tuple(aggregates), (*columns(list(keys) + data), *[F.col(f"_lakesync_latest.{c}").alias(c) for c in PROVENANCE],
                               unchanged.alias(UNCHANGED), F.current_timestamp().alias("_applied_at"))


def ensure_table(spark: SparkSession, path: str, schema_ddl: str,
                 properties: dict[str, str] | None = None) -> DeltaTable:
    """The Delta table at `path`, created with this schema, or given the columns it lacks
    (a column added in Postgres arrives with the first change that carries it)."""
    wanted = spark.createDataFrame([], schema_ddl).schema.fields
    if DeltaTable.isDeltaTable(spark, path):
        table = DeltaTable.forPath(spark, path)
        present = set(table.toDF().columns)
        missing = [f for f in wanted if f.name not in present]
        if missing:
            added = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in missing)
            spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({added})")
            table = DeltaTable.forPath(spark, path)
        return table
    log = lake.at(path) / "_delta_log"
    if log.is_dir() and not any(log.glob("[0-9]*.json")) and not any(log.glob("*.checkpoint*")):
        # A creation killed before its first commit leaves a log with no version, which
        # Delta neither opens nor creates over. Nothing was ever committed: it goes.
        lake.remove_tree(log)
    builder = DeltaTable.createIfNotExists(spark).location(path)
    for field in wanted:
        builder = builder.addColumn(field.name, field.dataType, nullable=True)
    for key, value in {**TABLE_PROPERTIES, **(properties or {})}.items():
        builder = builder.property(key, value)
    return builder.execute()


TOMBSTONE_COLUMNS = ["_commit_lsn", "_lsn", "_source_ts", "_applied_at"]


def still_applicable(changes: DataFrame, keys: list[str], truncated_at: tuple[int, int] | None,
                     tombstones: DataFrame | None, ranges: list[tuple[Column, Column]] | None = None) -> DataFrame:
    """Step 1: the changes (not truncates) newer than the latest truncate and than their
    key's tombstone. A delete equal to its own tombstone stays (its replay is harmless).
    `ranges` (the `Extent` of `changes`) spare reading the tombstones of other keys."""
    rows = changes.where("_op != 't'")
    if truncated_at is not None:
        rows = rows.where(newer_than_literal(truncated_at))
    if tombstones is not None:
        if ranges is not None:
            tombstones = tombstones.where(in_ranges(F.col(quoted(keys[0])), ranges))
        # An anti join on the key and the order, not the latest tombstone per key joined
        # back: no aggregate and no shuffle when the tombstones are small enough to broadcast.
        same_key = " AND ".join(f"r.{quoted(k)} = d.{quoted(k)}" for k in keys)
        deleted_after = later(("d._commit_lsn", "d._lsn"), ("r._commit_lsn", "r._lsn"))
        rows = rows.alias("r").join(tombstones.alias("d"), F.expr(f"{same_key} AND {deleted_after}"), "left_anti")
    return rows


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's properties, from its metadata alone (DeltaTable.detail() would also
    reconstruct the file list: seconds after each commit here)."""
    return {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}


def never_written(path: str) -> bool:
    """Whether no commit of the Delta table at `path` has added a data file yet (created,
    at most altered since): read from its log files. False once it has a checkpoint (a
    table with that many commits is not worth the reading)."""
    log = lake.at(path) / "_delta_log"
    if (log / "_last_checkpoint").is_file():
        return False
    for commit in log.glob("[0-9]*.json"):
        if any("add" in json.loads(line) for line in commit.read_text().splitlines() if line.strip()):
            return False
    return True


def inserts(target: DeltaTable, latest: DataFrame) -> DataFrame:
    """Step 3 into a table that has no rows: all the MERGE would do is insert the latest
    changes that are not deletes. In the target's columns (null where the batch carries
    none), for an append."""
    carried = set(latest.columns)
    return latest.where("_op != 'd'").select(*[
        (F.col(quoted(f.name)) if f.name in carried else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in target.toDF().schema.fields])


# At most this many ranges of the first key column in a MERGE's condition: a file is read
# when its key range meets one of them. More ranges skip more files, and each is one more
# comparison per file's statistics and per row the MERGE joins.
KEY_RANGES = 16
# The first key column's types whose ranges are split at the widest gaps between the
# batch's keys (integers: a gap is a count of keys no row of the batch has); any other
# type Delta keeps min/max statistics for gets one range, from the least to the greatest.
_SPLIT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_ORDERED = _SPLIT + (T.StringType, T.DateType, T.TimestampType, T.TimestampNTZType, T.DecimalType)


@dataclass(frozen=True)
class Extent:
    """What a batch's changes span (`extent_aggregates`): the values of the first key
    column as closed ranges [low, high] (literals), at most KEY_RANGES, covering every one
    of them, or None when that column's type has no order Delta keeps statistics for (then
    no file is skipped); and their oldest and newest source positions (None without
    changes)."""

    ranges: list[tuple[Column, Column]] | None
    oldest: Position | None
    newest: Position | None


def extent_aggregates(keys: list[str], first: T.DataType, counted: Column) -> list[Column]:
    """The aggregates over a table's changes whose row `extent_of` reads: what the rows
    where `counted` holds span; `first`: the first key column's type. Aggregated with
    others in one job (MirrorBatch's screening)."""
    column = F.when(counted, F.col(quoted(keys[0])))
    position = F.when(counted, F.struct("_commit_lsn", "_lsn"))
    aggregates = [F.min(position).alias("oldest"), F.max(position).alias("newest")]
    if isinstance(first, _SPLIT):
        aggregates.append(F.array_sort(F.collect_set(column)).alias("values"))  # (nulls left out)
    elif isinstance(first, _ORDERED):
        # Through their text and back, in the session's time zone both ways: a timestamp
        # handed to Python and back would pass through the Python process' local time zone.
        aggregates += [F.min(column).cast("string").alias("low"), F.max(column).cast("string").alias("high")]
    return aggregates


def extent_of(row: Row, first: T.DataType) -> Extent:
    """The `Extent` in a row of `extent_aggregates`; `first`: the first key column's type."""
    ranges = None
    if isinstance(first, _SPLIT):
        ranges = [(F.lit(low).cast(first), F.lit(high).cast(first)) for low, high in cover(row["values"], KEY_RANGES)]
    elif isinstance(first, _ORDERED):
        ranges = [] if row["low"] is None else [(F.lit(row["low"]).cast(first), F.lit(row["high"]).cast(first))]
    return Extent(ranges, *[tuple(row[end]) if row[end] is not None else None for end in ("oldest", "newest")])


def cover(values: list[int], most: int) -> list[tuple[int, int]]:
    """The closed ranges, at most `most`, that cover sorted distinct integers `values`
    with the fewest integers outside them: split at the widest gaps."""
    if not values:
        return []
    widest = heapq.nlargest(most - 1, range(1, len(values)), key=lambda i: values[i] - values[i - 1])
    cuts = sorted(i for i in widest if values[i] - values[i - 1] > 1)
    starts, ends = [0, *cuts], [*cuts, len(values)]
    return [(values[start], values[end - 1]) for start, end in zip(starts, ends)]


def in_ranges(column: Column, ranges: list[tuple[Column, Column]]) -> Column:
    """`column` within one of `ranges` (false for none)."""
    within = [column.between(low, high) for low, high in ranges]
    condition = within[0] if within else F.lit(False)
    for other in within[1:]:
        condition = condition | other
    return condition


def merge_changes(target: DeltaTable, latest: DataFrame, keys: list[str],
                  truncated_at: tuple[int, int] | None = None,
                  ranges: list[tuple[Column, Column]] | None = None) -> DeltaMergeBuilder:
    """Step 3: the MERGE of `latest` (one change per key, from latest_per_key) into `target`,
    for the batch's commit to execute (sync/delta/commit.py `merge`); `truncated_at` is the
    position of the batch's latest truncate of this table, if it has one; `ranges`, from
    `Extent`, cover every key of `latest` (the target files outside them are skipped)."""
    on, update, insert = _merge_clauses(tuple(keys), tuple(latest.columns))
    newer = newer_than("s", "t")
    if ranges is not None and truncated_at is None:
        on = on & in_ranges(F.col(f"t.{quoted(keys[0])}"), ranges)
    merge = (target.alias("t").merge(latest.alias("s"), on)
             .whenMatchedDelete(condition=f"s._op = 'd' AND {newer}")
             .whenMatchedUpdate(condition=f"s._op != 'd' AND {newer}", set=update)
             .whenNotMatchedInsert(condition="s._op != 'd'", values=insert))
    if truncated_at is not None:
        merge = merge.whenNotMatchedBySourceDelete(
            condition=f"NOT {newer_than_literal(truncated_at, side='t')}")
    return merge


@expressions
def _merge_clauses(keys: tuple[str, ...], names: tuple[str, ...]) -> tuple[Column, dict, dict]:
    """merge_changes' key condition, update and insert for a table's keys and the columns
    of its latest changes."""
    on = F.expr(" AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in keys))
    written = [c for c in names if c != UNCHANGED]
    data = set(written) - set(keys) - set(PROVENANCE) - {"_applied_at"}

    def new(c: str):
        return F.col(f"s.{quoted(c)}")

    def new_unless_unchanged(c: str):  # an unchanged TOASTed value: the target keeps its own
        return F.when(F.array_contains(F.col(f"s.{UNCHANGED}"), c), F.col(f"t.{quoted(c)}")).otherwise(new(c))
    update = {quoted(c): new_unless_unchanged(c) if c in data else new(c) for c in written}
    return on, update, {quoted(c): new(c) for c in written}


# A MERGE without deletion vectors rewrites each file it touches whole: cheaper while the
# table is small (20 changes into 1k rows here: 1.3 s without, 2.4 s with), dear once
# its files are large. A table starts without them (TABLE_PROPERTIES) and takes them on
# from the first MERGE that copied more unchanged rows than this.
COPIED_ROWS_FOR_DELETION_VECTORS = 100_000


def deletion_vectors_if_copying(spark: SparkSession, path: str) -> None:
    """After a MERGE into `path`: turn deletion vectors on if that MERGE copied more than
    COPIED_ROWS_FOR_DELETION_VECTORS unchanged rows (one that marked rows with them copied
    none). A metadata commit; repeating it changes nothing."""
    last = last_commit_info(path)
    copied = int((last.get("operationMetrics") or {}).get("numTargetRowsCopied", 0))
    if last.get("operation") == "MERGE" and copied > COPIED_ROWS_FOR_DELETION_VECTORS:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{DELETION_VECTORS}' = 'true')")


def table_exists(path: str) -> bool:
    return (lake.at(path) / "_delta_log").is_dir()


_found_versions: dict[str, int] = {}  # per table path: the latest version `latest_version` found


def latest_version(path: str) -> int:
    """The table's latest version, from its log's files, probed upwards (in a bucket each
    probe is a request), never by listing the whole log: from the version found the last
    time while its file is there (a version's number only grows; a table removed and made
    again may have none of that number yet), else from the last checkpoint on."""
    log = lake.at(path) / "_delta_log"
    version = _found_versions.get(path)
    if version is None or not (log / f"{version:020d}.json").is_file():
        try:
            version = json.loads((log / "_last_checkpoint").read_text())["version"]
        except (FileNotFoundError, ValueError, KeyError):  # none yet, or being rewritten: probe from the start
            version = 0
    while (log / f"{version + 1:020d}.json").is_file():
        version += 1
    _found_versions[path] = version
    return version


def last_commit_info(path: str) -> dict:
    """The commitInfo action of the table's latest version, read from its log file
    (DeltaTable.history(1) runs a Spark job for it: 0.4 s a call here)."""
    return _commit_info(lake.at(path) / "_delta_log" / f"{latest_version(path):020d}.json")


def _commit_info(commit: LakePath) -> dict:
    """The commitInfo action of one commit's log file; empty when the file is gone."""
    if not commit.is_file():
        return {}
    for line in commit.read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            return action["commitInfo"]
    return {}


def rows_added(path: str) -> int:
    """Rows the latest commit of the Delta table at `path` added (an append's
    numOutputRows), from its log file: no second pass over what was written."""
    return int((last_commit_info(path).get("operationMetrics") or {}).get("numOutputRows", 0))


def created_at(path: str) -> float | None:
    """When the Delta table at `path` was created (its first commit's time, seconds since
    the epoch), from that commit's log file; None when there is none (no table, or a log
    cleaned up to its checkpoints, which only an old table has)."""
    first = _commit_info(lake.at(path) / "_delta_log" / f"{0:020d}.json")
    return first["timestamp"] / 1000 if first else None


def merge_metrics(result: DataFrame | None) -> dict[str, int]:
    """Delta's metrics of one MERGE (num_affected_rows, ...); empty when Delta skipped
    the commit as already applied (commit.py: same txnAppId and txnVersion)."""
    row = result.first() if result is not None else None
    return row.asDict() if row is not None else {}


def tombstones_of(latest: DataFrame, keys: list[str]) -> DataFrame:
    """Step 4: a tombstone for every key whose latest change in the batch deletes it (appended
    by the caller)."""
    return latest.where("_op = 'd'").select(*columns(keys), *TOMBSTONE_COLUMNS)
