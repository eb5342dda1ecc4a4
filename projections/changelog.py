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
from typing import Callable, Iterator

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
from sync.delta import catalog, points, reader
from sync.delta.commit import BatchCommit
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table, latest_version, rows_added, table_exists, table_properties
from sync.delta.reader import Readers
from sync.lake import LakePath
from sync.projection import KafkaTopics, Projection, Target
from sync.streaming.batch import Batch
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome, Steps
from sync.streaming.stream import Ranges, read_ranges, read_topics, run_batches, start_offsets

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

    # Where generated code overtakes interpreted (docs/benchmark.md): a batch of 5,000
    # records 15% slower generated, of 10,000 10% faster, of 50,000 37% faster.
    generated_code_from = 8_000

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
        partitions = BatchPartitions(self.settings, checkpoint, commit.batch_id)
        self.code_for(batch, partitions)
        rows, held = transactions.gate(parsed(batch), commit.batch_id, checkpoint,
                                       self.transaction_rule, self.read_again, partitions,
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

    def check(self, settings: Settings, readers: Readers, conn, target: Target) -> Report:
        """verify's comparison for the changelog (see Oracle above), read by DuckDB."""
        source, key_columns = _postgres_keys(conn, settings.capture)
        if not table_exists(target.table):
            return compare(target, source, [], ["table", "key"], ["text", "jsonb"], ["table", "key"])
        start, table = start_offsets(settings), reader.scan(readers.duck, target.table)
        live = live_keys(readers.duck, table, key_columns, _key_renames(settings, key_columns), start,
                         sorted({name for name, _ in source}))
        report = compare(target, source, live, ["table", "key"], ["text", "jsonb"], ["table", "key"])
        repeated = repeated_positions(readers.duck, table, start)
        if repeated:
            report.differences += repeated
            report.error = f"{repeated} Kafka positions appear more than once"
        return report

    def checks_with_spark(self, target: Target) -> bool:
        return False


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


def live_keys(duck, table: str, key_columns: dict[str, list[str]], renamed: dict[str, dict[str, str]],
              start: dict[tuple[str, int], int], tables: list[str]) -> Iterator[tuple[str, str]]:
    """The (table, key) of every key of `tables` the changelog at `table` (a delta_scan
    path) leaves live: its latest change not a delete, and after its table's latest
    truncate or drop; read by DuckDB from Kafka position `start` on. `key_columns`: each
    table's primary key columns now, `renamed`: their earlier names (`_key_renames`).
    """
    found = duck.execute(_live_keys_sql(key_columns, renamed, start, tables), [table])
    while batch := found.fetchmany(10_000):
        yield from batch


def repeated_positions(duck, table: str, start: dict[tuple[str, int], int]) -> int:
    """How many Kafka positions the changelog at `table` holds more than once."""
    return duck.execute(f"SELECT count(*) FROM (SELECT 1 FROM delta_scan(?) WHERE {_at_or_after(start)} "
                        "GROUP BY _topic, _partition, _offset HAVING count(*) > 1)", [table]).fetchone()[0]


def _live_keys_sql(key_columns: dict[str, list[str]], renamed: dict[str, dict[str, str]],
                   start: dict[tuple[str, int], int], tables: list[str]) -> str:
    """`live_keys`' query (its delta_scan path the one parameter). A key is JSON as DuckDB writes it (compact, UTF-8), the key column's or one
    built of the row image's key columns for a change made while its table had none, so
    that a key's changes from before and after its table gained the key group together;
    under its key columns' names now."""
    def literal(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    def pointer(column: str) -> str:  # RFC 6901: the column's name as a JSON pointer
        return literal("/" + column.replace("~", "~0").replace("/", "~1"))

    image_keys = " ".join(
        f"WHEN {literal(table)} THEN json_object("
        + ", ".join(f"{literal(c)}, json_extract(coalesce(after, before), {pointer(c)})" for c in columns) + ")"
        for table, columns in sorted(key_columns.items()))
    rekeyed = "" if not key_columns else f"""UNION ALL
            SELECT "table", _op, CASE WHEN coalesce(after, before) IS NOT NULL THEN CASE "table" {image_keys} END END,
                   _commit_lsn, _lsn, _offset
            FROM log WHERE log.key IS NULL AND "table" IN ({", ".join(map(literal, sorted(key_columns)))})"""
    key = "json(key)"
    for table, names in sorted(renamed.items()):
        now = key
        for old, new in names.items():
            now = f"replace({now}, {literal(_json_name(old))}, {literal(_json_name(new))})"
        key = f"CASE WHEN \"table\" = {literal(table)} THEN {now} ELSE {key} END"
    dropped = "concat_ws('.', json_extract_string(after, '$.schema_name'), json_extract_string(after, '$.table_name'))"
    listed = ", ".join(map(literal, tables)) or "NULL"
    return f"""
        WITH log AS (SELECT * FROM delta_scan(?) WHERE {_at_or_after(start)}),
        keyed AS (
            SELECT "table", _op, {key} AS key, _commit_lsn, _lsn, _offset FROM log WHERE log.key IS NOT NULL
            {rekeyed}),
        truncated AS (
            SELECT "table", max({{'c': _commit_lsn, 'l': _lsn}}) AS truncated_at FROM (
                SELECT "table", _commit_lsn, _lsn FROM keyed WHERE _op = 't'
                UNION ALL
                SELECT {dropped}, _commit_lsn, _lsn FROM log WHERE "table" = {literal(TABLE_DROPS_TABLE)} AND _op = 'c')
            GROUP BY "table"),
        latest AS (
            SELECT "table", key, arg_max({{'op': _op, 'c': _commit_lsn, 'l': _lsn}},
                                         {{'c': _commit_lsn, 'l': _lsn, 'o': _offset}}) AS change
            FROM keyed WHERE _op IN ('c', 'u', 'r', 'd') AND key IS NOT NULL GROUP BY "table", key)
        SELECT latest."table", key FROM latest LEFT JOIN truncated USING ("table")
        WHERE change.op != 'd' AND (truncated_at IS NULL OR {{'c': change.c, 'l': change.l}} > truncated_at)
              AND latest."table" IN ({listed})"""


def _at_or_after(start: dict[tuple[str, int], int]) -> str:
    """SQL of sync/streaming/stream.py's `at_or_after` over the changelog's Kafka positions."""
    if not start:
        return "true"
    cases = " ".join(f"WHEN _topic = '{topic.replace(chr(39), chr(39) * 2)}' AND _partition = {partition} THEN {offset}"
                     for (topic, partition), offset in sorted(start.items()))
    return f"_offset >= CASE {cases} ELSE 0 END"


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
