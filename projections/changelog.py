"""The bronze changelog: every change event as received, appended, never changed.

Input:  the same topics as the mirrors (every captured table's, and the drops of captured tables), from offset zero,
        and the source's transaction boundaries, held as the mirrors hold them: a batch
        appends whole source transactions only, in commit order, and holds the rest for
        the next (sync/cdc/transactions.py), so no version shows part of one.
Key:    the Kafka position (topic, partition, offset): one row per record, once.
Target: <lake>/changelog, an append-only Delta table (`delta.appendOnly=true`): the
        table, op, key, before and after images as JSON text, and the provenance columns.
        `key` is the primary key; null for a change of a table that has none.
        Kafka compaction removes a key's older versions from its topic; the changelog
        keeps them, so history-needing projections (SCD2, audit) read it, not Kafka.
Apply:  per batch: 1. the changes of whole source transactions (the rest held, written
        down before any commit); 2. one append (none without a change), tagged txnAppId
        `changelog` / txnVersion = batch id, so a replayed batch adds nothing; fenced like
        every commit (sync/delta/commit.py); 3. publish the changelog's consistent point:
        its version, at the source transaction the batch applied through, unless fenced
        (sync/delta/points.py). The mirrors and the ledger stop their batches where it
        stands (`FOLLOW_ORDER` in sync/commands/snapshot.py).
        Kafka tombstones (null values) carry no change and are not kept. A record that
        is not a change event is kept too, with null op and images: the changelog holds
        what was received, and the mirrors send such records to the dead letters.
Oracle: no Postgres query gives history; `check` proves the changelog complete and
        free of duplicates instead: each Kafka position appears once, and replaying it
        (latest op per key, after the table's latest truncate or drop) leaves exactly the keys
        Postgres holds now. A change made while its table had no primary key (pgbench -i
        adds its keys after loading) counts under the key its row image holds, one made
        before a key column was renamed under the column's name now.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Callable

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections.mirrors import TOPICS, WHOLE_TRANSACTIONS, table_keys, transaction_rule
from sync.cdc import transactions
from sync.cdc.columns import earlier_names, read_history
from sync.cdc.decode import SOURCE_STRUCT, is_keyless
from sync.cdc.ordering import position_columns
from sync.compare import Report, compare
from sync.config import TABLE_DROPS_TABLE, CaptureSet, Settings, pg_quoted
from sync.delta import catalog, points
from sync.delta.commit import BatchCommit
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table, latest_version, rows_added, table_properties
from sync.lake import LakePath
from sync.projection import KafkaTopics, Projection, Target
from sync.streaming.batch import Batch
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome, Steps
from sync.streaming.stream import Ranges, at_or_after, read_ranges, read_topics, run_batches, start_offsets

NAME = "changelog"
KIND = "changelog"
SCHEMA = ("`table` string, `_op` string, `key` string, `before` string, `after` string, "
          "`_commit_lsn` bigint, `_lsn` bigint, `_txid` bigint, `_source_ts` timestamp, "
          "`_topic` string, `_partition` int, `_offset` bigint, `_kafka_ts` timestamp, `_applied_at` timestamp")
# Its change data feed: the views and event time read a range of its versions again (the
# rows of the source transactions a batch held: projections/derived.py). A feed is
# readable from the version that enabled it on (CHANGE_FEED_FROM): 0 for a changelog
# created so, the enabling commit's for one created before.
CHANGE_FEED_FROM = "lakesync.changeFeedFrom"
PROPERTIES = {"delta.appendOnly": "true", "delta.enableChangeDataFeed": "true", CHANGE_FEED_FROM: "0"}


def changelog_path(settings: Settings) -> str:
    return str(catalog.root(settings, NAME) / "changelog")


def ensure(spark: SparkSession, path: str, fence: Fence) -> None:
    """The changelog table, with its change data feed on: a changelog created before the
    feed gets it in one commit, which names its own version as where the feed begins
    (one writer here: the changelog's query starts after this)."""
    ensure_table(spark, path, SCHEMA, {**PROPERTIES, **fence.properties})
    if CHANGE_FEED_FROM not in table_properties(spark, path):
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', "
                  f"'{CHANGE_FEED_FROM}' = '{latest_version(path) + 1}')")


def change_feed_from(spark: SparkSession, path: str) -> int | None:
    """The first version of the changelog at `path` its change data feed holds (None: no feed)."""
    found = table_properties(spark, path).get(CHANGE_FEED_FROM)
    return int(found) if found is not None else None


def versions(spark: SparkSession, path: str, after: int, through: int) -> DataFrame:
    """The changelog's rows of its versions (after, through], from its change data feed."""
    if after >= through:
        return spark.read.format("delta").load(path).where(F.lit(False))
    return (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", after + 1)
            .option("endingVersion", through).load(path)
            .drop("_change_type", "_commit_version", "_commit_timestamp"))


# The envelope as the changelog reads it: the row images stay JSON text.
ENVELOPE = (f"struct<payload: struct<before: string, after: string, op: string, source: {SOURCE_STRUCT}, "
            "transaction: struct<id: string>>>")
CHANGE = "_lakesync_change"  # a record's payload, parsed (`parsed`)


def parsed(records: DataFrame) -> DataFrame:
    """Kafka records with their payload parsed, once, in a projection of its own: Spark
    does not inline an expensive expression that the next projection uses several times."""
    return records.select("*", F.from_json(F.col("value").cast("string"), ENVELOPE)["payload"].alias(CHANGE))


def as_changelog(records: DataFrame, *kept: str) -> DataFrame:
    """Kafka records (`parsed` or not) -> changelog rows (pure column expressions, no
    decoding by type), with the records' columns `kept` too. A record without a value
    has no row."""
    if CHANGE not in records.columns:
        records = parsed(records)
    records = records.where(F.col("value").isNotNull())
    change = F.col(CHANGE)
    commit_lsn, lsn = position_columns(change["source"]["sequence"])
    return records.select(*kept,
        F.concat_ws(".", change["source"]["schema"], change["source"]["table"]).alias("table"),
        change["op"].alias("_op"),
        F.when(~is_keyless(F.col("key")), F.get_json_object(F.col("key").cast("string"), "$.payload")).alias("key"),
        change["before"].alias("before"),
        change["after"].alias("after"),
        commit_lsn.alias("_commit_lsn"),
        lsn.alias("_lsn"),
        change["source"]["txId"].alias("_txid"),
        F.timestamp_micros(change["source"]["ts_us"]).alias("_source_ts"),
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_kafka_ts"),
        F.current_timestamp().alias("_applied_at"),
    )


class ChangelogBatch(Batch):
    """Steps 1-2 of Apply (the module docstring)."""

    def __init__(self, settings: Settings, fence: Fence,
                 read_again: Callable[[SparkSession, Ranges], DataFrame] | None = None):
        super().__init__(NAME, settings, fence)
        # The held changes of incomplete source transactions, read again (sync/cdc/transactions.py).
        read_again = read_again or (lambda spark, ranges: read_ranges(spark, settings, ranges, headers=True))
        self.read_again = lambda spark, ranges: parsed(read_again(spark, ranges))
        # The mirrors' rule, read off the parse the rows are made of.
        self.transaction_rule = replace(transaction_rule(settings),
                                        xid=lambda: transactions.xid_of_id(F.col(CHANGE)["transaction"]["id"]),
                                        sequence=lambda: F.col(CHANGE)["source"]["sequence"])
        self.align = points.aligner(settings, NAME)  # stop where the projections it follows stand

    def open(self, spark: SparkSession) -> None:
        ensure(spark, changelog_path(self.settings), self.fence)

    def apply(self, batch: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome:
        path = changelog_path(self.settings)
        # Each record parsed once, and checkpointed as a changelog row, a fraction of its
        # bytes (Debezium's inline schema is most of a value); a transaction's record as its
        # END alone.
        boundaries = F.col("topic") == transactions.TRANSACTIONS_TOPIC
        kept = ["topic", "partition", "offset", transactions.XID, transactions.END]

        def as_rows(marked: DataFrame) -> DataFrame:
            return (as_changelog(marked.where(~boundaries), *kept)
                    .unionByName(marked.where(boundaries).select(*kept), allowMissingColumns=True))
        checkpoint = catalog.checkpoint(self.settings, NAME)
        rows, held = transactions.gate(parsed(batch), commit.batch_id, checkpoint,
                                       self.transaction_rule, self.read_again,
                                       BatchPartitions(self.settings, checkpoint, commit.batch_id),
                                       self.settings.whole_transactions,
                                       keep=as_rows, until=self.settings.transactions_until, align=self.align)
        steps.done("read")
        # No version for a batch with no change to append (an idle source's: the
        # connector's heartbeat transactions): an empty append still commits,
        # checks its transaction id (4 Spark jobs) and gives the views a batch.
        appended = 0
        if not rows.isEmpty():
            commit.append(rows.drop(*kept), path)
            appended = rows_added(path)
        steps.done("append")
        if self.settings.whole_transactions:  # 3.
            points.publish(catalog.root(self.settings, NAME), NAME, commit.batch_id, held,
                           points.tables_now(PROJECTION.targets(self.settings)), self.fence)
        return Outcome(applied={NAME: appended}, held_transactions=len(held.xids), stopped_short=held.stopped_short)


class Changelog(Projection):
    name = NAME
    kind = KIND

    def source(self, settings: Settings) -> KafkaTopics:
        return TOPICS

    def targets(self, settings: Settings) -> list[Target]:
        return [Target(name=NAME, kind=KIND, table=changelog_path(settings), keys=["_topic", "_partition", "_offset"],
                       source=TOPICS.pattern)]

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """The changelog's consistent points (sync/delta/points.py): they name its version."""
        return [points.folder(catalog.root(settings, NAME), NAME)]

    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        # Created before the first record arrives: the views stream from this table.
        ensure(spark, changelog_path(settings), fence)
        return run_batches(read_topics(spark, settings, WHOLE_TRANSACTIONS), NAME, ChangelogBatch(settings, fence),
                           settings, once)

    def check(self, settings: Settings, spark: SparkSession, conn, target: Target) -> Report:
        """verify's comparison for the changelog (see Oracle above)."""
        source, key_columns = _postgres_keys(conn, settings.capture)
        if not DeltaTable.isDeltaTable(spark, target.table):
            return compare(target, source, [], ["table", "key"], ["text", "jsonb"], ["table", "key"])
        # After a resnapshot the log has a gap no one can fill: check from the new snapshot on.
        log = (spark.read.format("delta").load(target.table)
               .where(at_or_after(start_offsets(settings), "_topic", "_partition", "_offset")))

        @F.udf("string", useArrow=False)
        def key_in_image(table, image):
            """A keyless change's key: the table's primary key columns of its row image."""
            names = key_columns.get(table)
            if not names or image is None:
                return None
            row = json.loads(image)
            # Written as get_json_object writes a keyed change's key (compact, UTF-8), so a
            # key's changes from before and after its table gained the key group together.
            return json.dumps({name: row.get(name) for name in names}, separators=(",", ":"), ensure_ascii=False)
        # Split, not coalesced: Spark runs a Python function on every row of its input.
        rekeyed = (log.where(F.col("key").isNull() & F.col("table").isin(sorted(key_columns) or [""]))
                   .withColumn("key", key_in_image("table", F.coalesce("after", "before"))))
        keyed = log.where(F.col("key").isNotNull())
        renamed = _key_renames(settings, key_columns)
        if renamed:
            @F.udf("string", useArrow=False)
            def key_renamed(table, key):
                """The key's JSON (as get_json_object writes it) with its columns' names now."""
                for old, new in renamed[table].items():
                    key = key.replace(_json_name(old), _json_name(new))
                return key
            tables = F.col("table").isin(sorted(renamed))
            keyed = (keyed.where(~tables)
                     .unionByName(keyed.where(tables).withColumn("key", key_renamed("table", "key"))))
        keyed = keyed.unionByName(rekeyed)
        position = F.struct("_commit_lsn", "_lsn", "_offset")
        # A drop of the table (mirrors.DROPS_TOPIC) ends its rows like a truncate.
        dropped = F.concat_ws(".", F.get_json_object("after", "$.schema_name"), F.get_json_object("after", "$.table_name"))
        drops = log.where((F.col("table") == TABLE_DROPS_TABLE) & (F.col("_op") == "c")).select(
            dropped.alias("table"), "_commit_lsn", "_lsn")
        truncated = (keyed.where("_op = 't'").select("table", "_commit_lsn", "_lsn").unionByName(drops)
                     .groupBy("table").agg(F.max(F.struct("_commit_lsn", "_lsn")).alias("truncated")))
        latest = (keyed.where(F.col("_op").isin("c", "u", "r", "d") & F.col("key").isNotNull())
                  .groupBy("table", "key")
                  .agg(F.max_by(F.struct("_op", "_commit_lsn", "_lsn"), position).alias("last")))
        live = (latest.join(truncated, "table", "left")
                .where((F.col("last._op") != "d") & (F.col("truncated").isNull() | (
                    F.struct("last._commit_lsn", "last._lsn") > F.col("truncated"))))
                .where(F.col("table").isin(sorted({table for table, _ in source}) or [""]))
                .select("table", "key"))
        report = compare(target, source, (tuple(r) for r in live.toLocalIterator()),
                         ["table", "key"], ["text", "jsonb"], ["table", "key"])
        repeated = log.groupBy("_topic", "_partition", "_offset").count().where("count > 1").count()
        if repeated:
            report.differences += repeated
            report.error = f"{repeated} Kafka positions appear more than once"
        return report


PROJECTION = Changelog()


def _key_renames(settings: Settings, key_columns: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """Per table whose key columns were renamed (sync/cdc/columns.py): each earlier name of
    a key column, with the column's name now."""
    renamed: dict[str, dict[str, str]] = {}
    for (schema, table), changes in read_history(settings).items():
        name = f"{schema}.{table}"
        for column in key_columns.get(name, []):
            for _, old in earlier_names(column, changes):
                if old is not None:
                    renamed.setdefault(name, {})[old] = column
    return renamed


def _json_name(name: str) -> str:
    """A column's name as a key of a JSON object (compact, UTF-8), with its colon."""
    return json.dumps(name, ensure_ascii=False) + ":"


def _postgres_keys(conn, capture: CaptureSet) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(schema.table, primary key as JSON) of every row of every captured table that has a
    primary key, and each such table's key columns."""
    tables = {f"{schema}.{table}": (schema, table, list(columns))
              for schema, table, columns in table_keys(conn, capture.schemas)
              if columns and capture.captures(schema, table)}
    keys = []
    for name, (schema, table, columns) in tables.items():
        pairs = ", ".join("'" + c.replace("'", "''") + f"', {pg_quoted(c)}" for c in columns)
        query = f"SELECT json_build_object({pairs})::text FROM {pg_quoted(schema)}.{pg_quoted(table)}"
        keys.extend((name, key) for (key,) in conn.execute(query).fetchall())  # no parameters: sent as it is
    return keys, {name: columns for name, (_, _, columns) in tables.items()}
