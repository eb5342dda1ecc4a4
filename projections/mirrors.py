"""Generic mirrors: every captured table, as a Delta table, with no code per table.

Input:  the compacted topics lakesync.<schema>.<table> of every table the connector
        captures (LAKESYNC_CAPTURE; one streaming query subscribes by pattern, so a
        table created or captured while everything runs is picked up by the next batch),
        and lakesync.lakesync.table_drops: a DROP TABLE, taken as a truncate of that table
        at the drop's source position (migration 0006), so a table created again under
        the same name starts from no rows; and lakesync.lakesync.column_changes: a RENAME
        or DROP COLUMN (migration 0009), followed at its source position, the records
        before it read under the names they were written with (sync/cdc/columns.py);
        and lakesync.transaction, the source's transaction boundaries: a batch applies
        whole source transactions only, in commit order, and holds the rest for the
        next (sync/cdc/transactions.py), so no version of a mirror shows part of one.
Key:    the table's primary key, from the Kafka record key's schema. A table without one
        is kept as a multiset of rows (sync/delta/multiset.py).
Target: <lake>/mirrors/<name>, columns of the table plus the provenance columns; the
        name is the table's for the public schema (mirror.orders), <schema>.<table>
        for the others (mirror.inventory.orders), so no two schemas collide.
Apply:  per table in the batch: bring the Delta table to the table's columns
        (sync/delta/schema.py), decode, latest change per key, MERGE if newer, record
        tombstones (sync/delta/merge.py), each write committed idempotently and fenced
        (sync/delta/commit.py). Records that cannot be applied go to the dead letters
        (sync/delta/deadletters.py); an incompatible type change stops that table's
        mirror alone (its records go to the dead letters, `status` names the cause).
Oracle: SELECT * FROM <schema>.<table> on Postgres.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from sync.cdc import columns as column_changes
from sync.cdc import transactions
from sync.cdc.columns import (COLUMNS_TOPIC, ColumnChange, current_columns, current_names, earlier_names, precedes,
                              until)
from sync.cdc.decode import ERROR, PROVENANCE, UNCHANGED, as_mirrored, decode_changes, is_keyless, mirrored
from sync.cdc.ordering import Position, newer_than_literal, parse_sequence, position_columns
from sync.cdc.types import ColumnType, columns, key_columns, quoted, table_columns
from sync.config import (CONTROL_SCHEMA, DEFAULT_SCHEMA, EVENTS_TOPIC_PREFIX, TABLE_DROPS_TABLE, TOPIC_PREFIX, Settings,
                         pg_quoted)
from sync.delta import catalog, deadletters, points
from sync.delta.commit import BatchCommit
from sync.delta.deadletters import DeadLetter
from sync.delta.fencing import Fence
from sync.delta.keychanges import SAVED_DDL, fill_moved_values, is_key_change, rows_moved_away
from sync.delta.merge import (TOMBSTONE_COLUMNS, Extent, created_at, ensure_table, extent_aggregates, extent_of,
                              inserts, last_commit_info, latest_per_key, merge_changes, never_written, rows_added,
                              still_applicable, table_properties, tombstones_of)
from sync.delta.multiset import additions, copies_removed, merge_multiset, signed_rows
from sync.delta.schema import (COLUMN_MAPPING, IncompatibleChange, column_changes_followed, column_changes_property,
                               evolve, finish_backfill, follow_column_changes, sql_string)
from sync.fault import crash_point
from sync.lake import LakePath
from sync.projection import KafkaTopics, Projection, Target
from sync.streaming.batch import Batch
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome, Steps
from sync.streaming.spark import expressions
from sync.streaming.stream import Ranges, at_or_after, read_ranges, read_topics, run_batches, start_offsets

NAME = "mirrors"
KIND = "mirror"
DROPS_TOPIC = f"{TOPIC_PREFIX}.{TABLE_DROPS_TABLE}"
# Every table topic the connector writes (prefix.schema.table), whatever the capture set:
# not the control schema's (but its drops and column changes) nor the outbox events'
# (prefix.events.type), two schemas LAKESYNC_CAPTURE refuses. A name with a dot has no
# topic of its own.
TOPIC_PATTERN = ("(?:" + re.escape(f"{TOPIC_PREFIX}.")
                 + "(?!" + "|".join(re.escape(f"{s}.") for s in (CONTROL_SCHEMA, EVENTS_TOPIC_PREFIX.split(".")[1])) + ")"
                 + r"[^.]+\.[^.]+|" + re.escape(DROPS_TOPIC) + "|" + re.escape(COLUMNS_TOPIC) + ")")
TOPICS = KafkaTopics(TOPIC_PATTERN, headers=True)  # a key change's delete is marked by a header
# What the mirrors read: the table topics and the source's transaction boundaries, so
# that no mirror's version holds part of a source transaction (sync/cdc/transactions.py).
WHOLE_TRANSACTIONS = KafkaTopics(transactions.with_boundaries(TOPIC_PATTERN), headers=True)
RECORDS_DDL = ("key binary, value binary, topic string, partition int, offset bigint, "
               "headers array<struct<key: string, value: binary>>")  # what the Kafka source hands a batch
KEYS_PROPERTY = "lakesync.keys"
TRUNCATED_PROPERTY = "lakesync.truncated_at"  # source position of the latest truncate applied
PROVENANCE_DDL = ("`_commit_lsn` bigint, `_lsn` bigint, `_txid` bigint, `_source_ts` timestamp, "
                  "`_op` string, `_topic` string, `_partition` int, `_offset` bigint, "
                  "`_applied_at` timestamp")


def mirror_name(schema: str, table: str) -> str:
    """A captured table's mirror name (its target is mirror.<name>)."""
    return table if schema == DEFAULT_SCHEMA else f"{schema}.{table}"


def source_table(name: str) -> tuple[str, str]:
    """(schema, table) of a mirror name: mirror_name's inverse (unambiguous: a table or
    schema whose name holds a dot has no topic the mirrors read)."""
    schema, _, table = name.rpartition(".")
    return (schema or DEFAULT_SCHEMA), table


def table_of(topic: str) -> str:
    """The mirror name of a table topic prefix.schema.table."""
    return mirror_name(*topic[len(TOPIC_PREFIX) + 1:].split(".", 1))


def mirror_path(settings: Settings, table: str) -> LakePath:
    return catalog.root(settings, NAME) / "mirrors" / table


def tombstone_path(settings: Settings, table: str) -> LakePath:
    return catalog.root(settings, NAME) / "tombstones" / table


def moved_path(settings: Settings, table: str) -> LakePath:
    """Rows a key change moved away in one batch, for the batch bringing its create
    (sync/delta/keychanges.py)."""
    return catalog.root(settings, NAME) / "moved" / table


def target(settings: Settings, name: str) -> Target:
    schema, table = source_table(name)
    return Target(name=f"mirror.{name}", kind=KIND, table=str(mirror_path(settings, name)),
                  oracle_sql=f"SELECT * FROM {pg_quoted(schema)}.{pg_quoted(table)}",
                  source=f"{schema}.{table}")


class Mirrors(Projection):
    name = NAME
    kind = KIND

    def source(self, settings: Settings) -> KafkaTopics:
        return TOPICS

    def targets(self, settings: Settings) -> list[Target]:
        """A target per mirror in the lake (status lists what exists)."""
        root = catalog.root(settings, NAME) / "mirrors"
        found = sorted(p.name for p in root.glob("*") if (p / "_delta_log").is_dir()) if root.is_dir() else []
        return [target(settings, table) for table in found]

    def verify_targets(self, settings: Settings, conn) -> list[Target]:
        """Every captured table in Postgres, and every mirror in the lake whose captured
        table is gone (dropped and not created again: compared with no rows). A mirror of
        a table the capture set no longer takes is not kept, so not compared."""
        in_lake = {t.name.split(".", 1)[1] for t in self.targets(settings)}
        existing = {mirror_name(schema, table): (schema, table, list(columns or []))
                    for schema, table, columns in table_keys(conn, settings.capture.schemas)}
        keys = {name: columns for name, (schema, table, columns) in existing.items()
                if settings.capture.captures(schema, table)}
        gone = "SELECT NULL::text AS dropped WHERE false"  # Postgres has no rows of a dropped table
        renamed = _renamed_in_mirror(conn, settings.capture.schemas)
        return ([replace(target(settings, name), keys=[mirrored(k) for k in columns],
                         **({"oracle_sql": renamed[name]} if name in renamed else {}))
                 for name, columns in sorted(keys.items())]
                + [replace(target(settings, name), oracle_sql=gone) for name in sorted(in_lake - set(existing))
                   if settings.capture.captures(*source_table(name))])

    def lag_of(self, target: Target, lag_by_topic: dict[str, int]) -> int:
        return lag_by_topic.get(f"{TOPIC_PREFIX}.{target.source}", 0)

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """What the mirrors keep besides their tables: the tombstones, the rows moved away,
        the consistent points (a reset's new tables make the old ones meaningless)."""
        return [catalog.root(settings, NAME) / "tombstones", catalog.root(settings, NAME) / "moved",
                points.folder(catalog.root(settings, NAME), NAME)]

    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        return run_batches(read_topics(spark, settings, WHOLE_TRANSACTIONS), NAME, MirrorBatch(settings, fence),
                           settings, once)


PROJECTION = Mirrors()


def transaction_rule(settings: Settings) -> transactions.Rule:
    """What END counts of the table topics' changes (sync/cdc/transactions.py): each table's
    but the outbox's (routed to the events' topics: never a mirror's)."""
    outbox = f"{TOPIC_PREFIX}.{settings.outbox_table}"
    return transactions.changes(lambda topic: topic != outbox and re.fullmatch(TOPIC_PATTERN, topic) is not None)


def table_keys(conn, schemas: list[str]) -> list[tuple[str, str, list[str] | None]]:
    """(schema, table, primary key columns or None) of every table of `schemas`."""
    return conn.execute(
        "SELECT n.nspname, c.relname, array_agg(a.attname ORDER BY k.ord) FILTER (WHERE a.attname IS NOT NULL) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
        "LEFT JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
        "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') GROUP BY n.nspname, c.relname", (schemas,)).fetchall()


def _renamed_in_mirror(conn, schemas: list[str]) -> dict[str, str]:
    """Per mirror whose columns are not all named as in Postgres (`mirrored`): the query of
    its table's rows under the mirror's names."""
    found = conn.execute(
        "SELECT n.nspname, c.relname, array_agg(a.attname::text ORDER BY a.attnum) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') GROUP BY n.nspname, c.relname "
        "HAVING bool_or(a.attname LIKE '\\_%%')", (schemas,)).fetchall()
    return {mirror_name(schema, table): "SELECT " + ", ".join(
                f"{pg_quoted(c)} AS {pg_quoted(mirrored(c))}" for c in columns)
            + f" FROM {pg_quoted(schema)}.{pg_quoted(table)}"
            for schema, table, columns in found if any(mirrored(c) != c for c in columns)}


class MirrorBatch(Batch):
    """Applies one micro-batch to every table it touches (sync/streaming/batch.py runs it).

    Steps, in order:
      1. Per topic in the batch, in one job: the table's columns, key and latest truncate
         (or drop: a table dropped in the batch without records in it is planned too),
         and the column history brought up to date (`_column_changes`: a table whose
         column was renamed or dropped in the batch is planned too).
      2. Per table, up to `apply_threads` tables at once (each on a session of its own;
         crash point `between_tables` when the first is done):
           a. decode its changes once, each record under the column names it was
              written with, checkpointed for b and c;
           b. find the records that cannot be applied (undecodable, or repeating a
              source position), and the key ranges and positions the others span;
           c. follow the renamed and dropped columns, evolve the schema, MERGE, record
              tombstones, finish a pending backfill.
         A table without a primary key takes a multiset MERGE in c instead; a batch
         holding both kinds of change (a key added or dropped) applies each kind in
         turn, in source order.
         Each Delta write is its own idempotent commit (txnAppId `mirrors:<table>`,
         `mirrors:<table>:keyless`, `mirrors:<table>:moved`); the tombstones are appended
         at least once (userMetadata `mirrors:<table>:tombstones`): a copy changes nothing.
      3. Append what was set aside to the dead letters (txnAppId `mirrors:dead_letters`).
      4. Publish the consistent point: every mirror's version, at the source transaction
         the batch applied through (sync/delta/points.py).
    A crash anywhere replays the whole batch, and every write of the replay is skipped
    or changes nothing.
    """

    # Where generated code overtakes interpreted (docs/benchmark.md): a batch of 20 changes
    # 25% slower generated, of 1,000 into 100k rows even, of 5,000 12% faster, of 50,000
    # into 1M rows 27% faster.
    generated_code_from = 2_000

    def __init__(self, settings: Settings, fence: Fence,
                 read_column_history: Callable[[], column_changes.History] | None = None,
                 read_again: Callable[[SparkSession, Ranges], DataFrame] | None = None):
        super().__init__(NAME, settings, fence)
        self.read_column_history = read_column_history or (lambda: column_changes.read_history(settings))
        # The held changes of incomplete source transactions, read again (sync/cdc/transactions.py).
        self.read_again = read_again or (lambda spark, ranges: read_ranges(spark, settings, ranges, headers=True))
        self.transaction_rule = transaction_rule(settings)
        self.align = points.aligner(settings, NAME)  # stop where the projections it follows stand
        self.after_resnapshot = at_or_after(start_offsets(settings))
        self.tombstone_tables: set[str] = set()  # created in this run (or found), not checked again
        # Per tombstones table: none is after this position (None: it has none); `_tombstones_after`.
        self.newest_tombstones: dict[str, Position | None] = {}
        self.finished_lock = threading.Lock()  # guards the count of tables done in a batch
        # Every column renamed or dropped (sync/cdc/columns.py): read whole at the first
        # batch and again when a table's columns change, and kept from the stream.
        self.column_history: column_changes.History | None = None
        self.columns_seen: dict[str, list[str]] = {}  # per topic: its columns in the last batch

    def apply(self, batch: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome:
        # Read from Kafka once and kept for every pass below, with the changes earlier
        # batches held read again, and the changes of source transactions not yet whole
        # held (sync/cdc/transactions.py). A local checkpoint, not a cache: MERGE refuses
        # a source with cached parts unless it copies the source first
        # (spark.databricks.delta.merge.materializeSource, sync/streaming/spark.py).
        checkpoint = catalog.checkpoint(self.settings, NAME)
        partitions = BatchPartitions(self.settings, checkpoint, commit.batch_id)
        self.code_for(batch, partitions)
        records, held = transactions.gate(batch.where(F.col("value").isNotNull() & self.after_resnapshot),
                                          commit.batch_id, checkpoint,
                                          self.transaction_rule, self.read_again, partitions,
                                          self.settings.whole_transactions,
                                          until=self.settings.transactions_until, align=self.align)
        steps.done("read")
        rows = self._tables(records)
        changed_at = self._column_changes(rows)
        topics = _with_drops(rows, changed_at)
        steps.done("plan")
        tables_done = 0

        def table_task(row) -> Callable[[BatchCommit], TableResult]:
            def run(table_commit: BatchCommit) -> TableResult:
                nonlocal tables_done
                result = self._table(table_commit, records, row)
                with self.finished_lock:
                    tables_done += 1
                    if tables_done == 1 and len(topics) > 1:
                        crash_point("between_tables", self.settings.fault)
                return result
            return run

        results = self.concurrently(commit, [table_task(row) for row in topics])
        outcome = Outcome(applied={}, held_transactions=len(held.xids), stopped_short=held.stopped_short)
        dead: list[DeadLetter] = []
        for result in results:
            steps.add(result.steps)
            if result.applied is not None:
                outcome.applied[result.name] = result.applied
            if result.stopped:
                outcome.stopped[result.name] = result.stopped
            dead.extend(result.dead)
        steps.done("tables")
        deadletters.write(commit, self.settings, records, dead)
        steps.done("dead_letters")
        for letter in dead:
            outcome.dead_letters[letter.table] = outcome.dead_letters.get(letter.table, 0) + 1
        if self.settings.whole_transactions:
            self._publish_point(commit.batch_id, held, outcome)
        return outcome

    def _publish_point(self, batch_id: int, held: transactions.Held, outcome: Outcome) -> None:
        """Step 4: every mirror's version now, all at the source transaction the batch
        applied through (sync/delta/points.py). A stopped mirror is behind it: left out."""
        stopped = set(outcome.stopped) | {name for name, state in self.progress.state.get("tables", {}).items()
                                          if state.get("stopped") and name not in outcome.applied}
        points.publish(catalog.root(self.settings, NAME), NAME, batch_id, held,
                       points.tables_now([t for t in PROJECTION.targets(self.settings) if t.state_key not in stopped]),
                       self.fence)

    def _table(self, commit: BatchCommit, records: DataFrame, row) -> "TableResult":
        """Step 2 for one table, on `commit`'s session. A table Spark or Delta refuses (an
        incompatible type change, columns only case tells apart, ...) stops its own mirror
        alone: its records go to the dead letters, the other tables and projections go on."""
        steps = Steps()
        result = TableResult(table_of(row["topic"]), steps)
        topic_records = records.where(F.col("topic") == row["topic"])
        try:
            if row["value_schema"] is None:  # dropped or altered, and no record of its own in the batch
                changed_at = row["columns_changed_at"]
                changes = until(self._history_of(result.name), changed_at) if changed_at is not None else []
                if changes:
                    self.fence.check()
                    follow_column_changes(commit.spark, str(mirror_path(self.settings, result.name)), changes,
                                          [str(tombstone_path(self.settings, result.name))])
                if row["dropped_at"] is not None:
                    result.applied = self._dropped(commit.spark, result.name, row["dropped_at"])
                return result
            for keyless, part in _kinds(topic_records, row):
                table = self._plan(commit.spark, part, row, keyless)
                if table.error:
                    result.dead += _all_records(table.records, table.name, table.error)
                    continue
                if table.changes is None:
                    continue
                steps.done("decode")
                failed, span = _screened(table)
                steps.done("refuse")
                result.applied = (result.applied or 0) + self._apply_table(commit, table, failed, span, steps)
                result.dead += failed
        except (IncompatibleChange, AnalysisException) as error:
            result.stopped = f"mirror stopped: {_first_line(error)}"
            result.dead = _all_records(records.where(F.col("topic") == row["topic"]), result.name, result.stopped)
        return result

    def _tables(self, records: DataFrame) -> list[dict]:
        """Per topic in the batch: latest value and key schema, latest truncate position,
        whether it deletes anything. Each record's JSON is parsed once, for its op; the
        schemas are read from the one record per topic that carries the latest (a
        Debezium record's schema is most of its bytes, and copying it out of every
        record cost more than the rest of this step). `moves` and `moved_away`: the batch
        has the create or the delete half of a key change (sync/delta/keychanges.py)."""
        read, aggregates, selected = _per_topic()
        # Sorted here, not by Spark: a sort of a row per topic cost a sampling job and a shuffle.
        return sorted(records.select(*read).groupBy("topic").agg(*aggregates).select(*selected).collect(),
                      key=lambda row: row["topic"])

    def _plan(self, spark: SparkSession, records: DataFrame, row, keyless: bool) -> "TablePlan":
        """What step 3 needs for one table's `records` (all keyless changes or none);
        `error` when none of its records can apply."""
        name = table_of(row["topic"])
        plan = TablePlan(name=name, path=str(mirror_path(self.settings, name)), records=records, keyless=keyless,
                         deletes=bool(row["deletes"]), updates=bool(row["updates"]), moves=bool(row["moves"]),
                         moved_away=bool(row["moved_away"]),
                         truncated_at=max([p for p in (parse_sequence(row["truncate_sequence"]), row["dropped_at"])
                                           if p is not None], default=None))
        try:
            plan.columns = table_columns(json.loads(row["value_schema"])) if row["value_schema"] else []
            plan.keys = [] if keyless else key_columns(json.loads(row["key_schema"])) if row["key_schema"] else None
        except (ValueError, KeyError, TypeError) as error:
            plan.error = f"cannot read the table's schema: {error}"
            return plan
        earlier = self._renamed(spark, plan, row)
        # From here on, the columns go by their names in the mirror (a user's `_op` as `__op`).
        plan.columns = as_mirrored(plan.columns)
        plan.keys = None if plan.keys is None else [mirrored(k) for k in plan.keys]
        earlier = {mirrored(name): chain for name, chain in earlier.items()}
        if plan.keys is None:  # only truncates in this batch: the key the mirror recorded
            plan.keys = self._recorded_keys(spark, plan.path)
            if plan.keys is None:
                return plan  # a table never mirrored was truncated: nothing to remove
            plan.keyless = not plan.keys
        # Decoded once and checkpointed: step 2 and step 3 each read it, and a plan over
        # the JSON itself costs several times the decode (its parse is repeated per use).
        plan.changes = decode_changes(plan.records, plan.columns, before=plan.keyless,
                                      earlier=earlier).localCheckpoint(eager=True)
        return plan

    def _column_changes(self, rows: list) -> dict[str, Position]:
        """Step 1's share of the column history: read whole at the first batch, and again
        when a table's columns changed since its last batch (the change's record may not
        be in this batch yet: Kafka makes a transaction visible partition by partition);
        then the batch's own records of column changes added. Returns per table topic the
        newest column change the batch records."""
        stale = self.column_history is None
        for row in rows:
            if row["value_schema"] is not None and row["topic"] not in (DROPS_TOPIC, COLUMNS_TOPIC):
                try:
                    names = [c.name for c in table_columns(json.loads(row["value_schema"]))]
                except (ValueError, KeyError, TypeError):
                    continue  # (the table's plan sets its records aside)
                stale |= self.columns_seen.get(row["topic"], names) != names
                self.columns_seen[row["topic"]] = names
        if stale:
            self.column_history = self.read_column_history()
        assert self.column_history is not None
        changed_at: dict[str, Position] = {}
        for value in (v for row in rows if row["topic"] == COLUMNS_TOPIC for v in row["column_changes"]):
            parsed = column_changes.parse(value)
            if parsed is not None:
                (schema, table), change = parsed
                column_changes.add(self.column_history, (schema, table), change)
                topic = f"{TOPIC_PREFIX}.{schema}.{table}"
                changed_at[topic] = max(change.at, changed_at.get(topic, change.at))
        return changed_at

    def _history_of(self, name: str) -> list[ColumnChange]:
        return (self.column_history or {}).get(source_table(name), [])

    def _renamed(self, spark: SparkSession, plan: "TablePlan", row) -> dict[str, list]:
        """With the table's column history (sync/cdc/columns.py): the plan's columns and
        key under their names after every change up to the batch's end (its last record,
        a column change it records, or one the mirror followed already: the changes after
        that wait for their own record), those changes (`plan.column_changes`), and per
        column the names its records may have used (for decode_changes)."""
        history = self._history_of(plan.name)
        if not history:
            return {}
        after = parse_sequence(row["last_sequence"])
        followed = (column_changes_followed(table_properties(spark, plan.path))
                    if DeltaTable.isDeltaTable(spark, plan.path) else None)
        up_to = max((p for p in (after, row["columns_changed_at"], followed) if p is not None), default=None)
        plan.column_changes = until(history, up_to) if up_to is not None else []
        plan.columns_followed = followed
        plan.columns = current_columns(plan.columns, plan.column_changes, after)
        if plan.keys:
            plan.keys = [k for k in current_names(plan.keys, plan.column_changes, after) if k is not None]
        return {c.name: chain for c in plan.columns if (chain := earlier_names(c.name, plan.column_changes))}

    def _apply_table(self, commit: BatchCommit, table: "TablePlan", failed: list[DeadLetter], span: Extent | None,
                     steps: Steps) -> int:
        """Step 3 for one table; returns the rows the MERGE affected. `span`: what its
        changes but the `failed` span (None for a keyless table). Its parts' seconds add up
        in `steps` over the batch's tables."""
        spark = commit.spark
        self.fence.check()  # the schema changes below commit outside the batch's commits
        keys = table.keys
        properties = {KEYS_PROPERTY: json.dumps(keys), **self.fence.properties}
        if table.column_changes:
            if table.columns_followed is None or table.column_changes[-1].at > table.columns_followed:
                follow_column_changes(spark, table.path, table.column_changes,
                                      [str(tombstone_path(self.settings, table.name))])
            # (A mirror created below starts as of them: its columns are named as they end.)
            properties.update(column_changes_property(table.column_changes[-1].at))
        records = table.records
        dropped = [c.at for c in table.column_changes
                   if c.new is None and mirrored(c.old) in {col.name for col in table.columns}]
        if dropped:  # a column dropped and added again: it was added after the drop, as the records after it tell
            commit_lsn, lsn = position_columns(F.get_json_object(F.col("value").cast("string"),
                                                                 "$.payload.source.sequence"))
            records = records.where(~precedes(commit_lsn, lsn, max(dropped)))
        target, recorded = evolve(spark, table.path, table.columns, PROVENANCE_DDL, records, properties)
        if recorded.get(KEYS_PROPERTY, properties[KEYS_PROPERTY]) != properties[KEYS_PROPERTY]:
            # A key added or dropped: a later batch of truncates alone goes by this one.
            spark.sql(f"ALTER TABLE delta.`{table.path}` SET TBLPROPERTIES "
                      f"('{KEYS_PROPERTY}' = {sql_string(properties[KEYS_PROPERTY])})")
        truncated_at = self._truncated_at(spark, table.path, recorded, table.truncated_at)
        steps.done("evolve")
        good = table.changes.where(F.col(ERROR).isNull()).drop(ERROR)
        if failed:
            refused = spark.createDataFrame([(f.topic, f.partition, f.offset) for f in failed],
                                            "_topic string, _partition int, _offset bigint")
            good = good.join(refused, ["_topic", "_partition", "_offset"], "left_anti")
        if table.keyless:
            applied = self._apply_multiset(commit, table, target, good, truncated_at, steps)
            finish_backfill(spark, table.path, table.columns, recorded)
            return applied
        # The target's and the tombstones' files read: those the batch's keys can be in
        # (`span`, taken before the key changes' fill, which changes no key or position).
        assert span is not None
        tombstones = str(tombstone_path(self.settings, table.name))
        known_dead = self._tombstones_after(spark, tombstones, span.oldest)
        if table.moves or table.moved_away:
            good = self._key_changes(commit, table, good, known_dead)
            steps.done("key_changes")
        # Computed once and checkpointed (see `records`): MERGE reads its source twice and
        # the tombstones once more.
        latest = latest_per_key(still_applicable(good, keys, truncated_at, known_dead, span.ranges),
                                keys).localCheckpoint()
        steps.done("latest_per_key")
        if never_written(table.path):
            # Nothing to match (a new table, every table of a rebuild): an append inserts what
            # the MERGE would, at a quarter of its cost (20 rows: 0.25 s, MERGE 0.97 s). Its
            # replay is skipped like any commit of the batch (same txnAppId and txnVersion).
            commit.append(inserts(target, latest), table.path, table.name)
            metrics = {"num_affected_rows": rows_added(table.path)}
        else:
            metrics = commit.merge(merge_changes(target, latest, keys, table.truncated_at, span.ranges),
                                   table.path, table.name)
        steps.done("merge")
        if table.deletes:
            if tombstones not in self.tombstone_tables:
                key_ddl = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in target.toDF().schema.fields
                                    if f.name in keys or f.name in TOMBSTONE_COLUMNS)
                ensure_table(spark, tombstones, key_ddl, {**COLUMN_MAPPING, **self.fence.properties})
                self.tombstone_tables.add(tombstones)
            # At least once: a replay's second copy of a tombstone changes no key's latest deletion.
            commit.append(tombstones_of(latest, keys), tombstones, f"{table.name}:tombstones", exactly_once=False)
            self.newest_tombstones[tombstones] = max(
                (p for p in (self.newest_tombstones[tombstones], span.newest) if p is not None), default=None)
        self._sweep_tombstones(spark, table.name)
        finish_backfill(spark, table.path, table.columns, recorded)
        steps.done("tombstones")
        return int(metrics.get("num_affected_rows", 0))

    def _apply_multiset(self, commit: BatchCommit, table: "TablePlan", target: DeltaTable, good: DataFrame,
                        truncated_at: tuple[int, int] | None, steps: Steps) -> int:
        """Step 3's MERGE for a table without a primary key (sync/delta/multiset.py)."""
        signed = signed_rows(still_applicable(good, [], truncated_at, None), target).localCheckpoint()
        added = additions(signed)
        steps.done("latest_per_key")
        name = f"{table.name}:keyless"
        if never_written(table.path) or (table.truncated_at is None and not (table.deletes or table.updates)):
            commit.append(inserts(target, added), table.path, name)  # nothing to remove: an append
            applied = rows_added(table.path)
        else:
            merge = merge_multiset(target, added, copies_removed(signed, target), table.truncated_at)
            applied = int(commit.merge(merge, table.path, name).get("num_affected_rows", 0))
        steps.done("merge")
        return applied

    def _tombstones_after(self, spark: SparkSession, path: str, oldest: Position | None) -> DataFrame | None:
        """The tombstones at `path`, or None when none is at or after `oldest`, the batch's
        oldest change: then no change of the batch is older than its key's deletion, nor
        at a key change's deleted old key (sync/delta/keychanges.py). So a live stream,
        whose changes come after every delete before them, reads no tombstones; a
        redelivery of older changes does. The newest tombstone's position is read once per
        run and table, then raised to the newest change of each batch that appends some."""
        if path not in self.newest_tombstones:
            newest = (spark.read.format("delta").load(path).agg(F.max(F.struct("_commit_lsn", "_lsn"))).first()[0]
                      if DeltaTable.isDeltaTable(spark, path) else None)
            self.newest_tombstones[path] = tuple(newest) if newest is not None else None
        newest = self.newest_tombstones[path]
        if newest is None or (oldest is not None and oldest > newest):
            return None
        return spark.read.format("delta").load(path)

    def _key_changes(self, commit: BatchCommit, table: "TablePlan", good: DataFrame,
                     known_dead: DataFrame | None) -> DataFrame:
        """The batch's key changes (sync/delta/keychanges.py): their creates filled, and the
        rows whose create is not in this batch saved, before the MERGE deletes them."""
        spark = commit.spark
        saved = str(moved_path(self.settings, table.name))
        has_saved = DeltaTable.isDeltaTable(spark, saved)
        if table.moves:
            good = fill_moved_values(spark, good, table.keys, table.path, known_dead,
                                     spark.read.format("delta").load(saved) if has_saved else None)
        if table.moved_away:
            rows = rows_moved_away(spark, table.records, good, table.keys, table.path)
            if rows is not None:
                if not has_saved:
                    ensure_table(spark, saved, SAVED_DDL, self.fence.properties)
                commit.append(rows, saved, f"{table.name}:moved")
        return good

    def _dropped(self, spark: SparkSession, name: str, dropped_at: tuple[int, int]) -> int:
        """A table dropped in the batch without records in it: its mirror's rows older than
        the drop go (a delete of what is older than a position: its replay removes nothing
        more). Returns the rows removed."""
        path = str(mirror_path(self.settings, name))
        if not DeltaTable.isDeltaTable(spark, path):
            return 0
        self.fence.check()
        truncated_at = self._truncated_at(spark, path, table_properties(spark, path), dropped_at)
        DeltaTable.forPath(spark, path).delete(f"NOT {newer_than_literal(truncated_at)}")
        return int(last_commit_info(path).get("operationMetrics", {}).get("numDeletedRows", 0))

    def _recorded_keys(self, spark: SparkSession, path: str) -> list[str] | None:
        if not DeltaTable.isDeltaTable(spark, path):
            return None
        recorded = table_properties(spark, path).get(KEYS_PROPERTY, "")
        if recorded.startswith("["):
            return json.loads(recorded)
        return [k for k in recorded.split(",") if k]  # as mirrors made before 2026-11-25 record them

    def _truncated_at(self, spark: SparkSession, path: str, properties: dict[str, str],
                      in_batch) -> tuple[int, int] | None:
        """The latest truncate the mirror has seen, this batch's included, recorded first so
        a change older than it redelivered in a later batch cannot bring a row back."""
        recorded = parse_sequence(properties.get(TRUNCATED_PROPERTY))
        latest = max([p for p in (recorded, in_batch) if p is not None], default=None)
        if latest is not None and latest != recorded:
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                      f"('{TRUNCATED_PROPERTY}' = '{json.dumps([str(latest[0]), str(latest[1])])}')")
        return latest

    def _sweep_tombstones(self, spark: SparkSession, table: str) -> None:
        """Remove tombstones (and rows saved for a key change, which its next batch used)
        written longer ago than the horizon, at most once an hour per table (the time of
        the last sweep is kept with the progress, across restarts). By write time, not
        source time: a rebuild replaying year-old deletes must keep their tombstones while
        it replays what came after them."""
        swept = self.progress.state.setdefault("tombstones_swept_at", {})
        if time.time() - swept.get(table, 0) < 3600:
            return
        paths = [p for p in (str(tombstone_path(self.settings, table)), str(moved_path(self.settings, table)))
                 if DeltaTable.isDeltaTable(spark, p)]
        if not paths:
            return
        for path in paths:
            created = created_at(path)
            # Nothing is older than its table: a younger one (a new table, every one of a
            # rebuild) has nothing to sweep, and counts as swept until the next hour's check.
            if created is None or time.time() - created >= self.settings.tombstone_hours * 3600:
                horizon = F.expr(f"current_timestamp() - INTERVAL {int(self.settings.tombstone_hours)} HOURS")
                DeltaTable.forPath(spark, path).delete(F.col("_applied_at") < horizon)
        swept[table] = time.time()


@dataclass
class TablePlan:
    """One table's share of a batch (MirrorBatch step 2)."""

    name: str
    path: str
    records: DataFrame
    keyless: bool                      # changes of a table without a primary key (a multiset)
    deletes: bool
    updates: bool
    moves: bool                        # the create half of a key change
    moved_away: bool                   # the delete half of a key change
    truncated_at: tuple[int, int] | None
    columns: list[ColumnType] = field(default_factory=list)
    keys: list[str] | None = None
    changes: DataFrame | None = None   # decoded, with `_error`; None when nothing applies
    column_changes: list[ColumnChange] = field(default_factory=list)  # renames and drops up to the batch's end
    columns_followed: Position | None = None  # the latest of them the mirror has followed
    error: str | None = None           # why none of the table's records can apply


@dataclass
class TableResult:
    """What step 2 did for one table."""

    name: str
    steps: Steps
    applied: int | None = None                                 # rows the MERGE affected
    stopped: str | None = None                                 # why the mirror stopped
    dead: list[DeadLetter] = field(default_factory=list)       # records set aside


def _with_drops(rows: list, columns_changed_at: dict[str, Position]) -> list[dict]:
    """The per-topic plan rows of step 1 without the drops' and column changes' topics,
    each with `dropped_at`, the source position of the table's latest drop in the batch (or
    None), and `columns_changed_at`, its latest column change's (or None). A table dropped
    or altered without records of its own in the batch gets a row of its own."""
    dropped: dict[str, tuple[int, int]] = {}
    for drop in (d for row in rows if row["topic"] == DROPS_TOPIC for d in row["drops"]):
        topic, position = f"{TOPIC_PREFIX}.{drop['schema']}.{drop['table']}", parse_sequence(drop["sequence"])
        if position is not None:  # any table of a published schema (migration 0007); no mirror, nothing to do
            dropped[topic] = max(position, dropped.get(topic, position))
    tables = [{**row.asDict(), "dropped_at": dropped.pop(row["topic"], None),
               "columns_changed_at": columns_changed_at.get(row["topic"])} for row in rows
              if row["topic"] not in (DROPS_TOPIC, COLUMNS_TOPIC)]
    with_records = {row["topic"] for row in tables}
    no_records = dict.fromkeys(("deletes", "updates", "moves", "moved_away", "keyed_from", "keyless_from",
                                "value_schema", "key_schema", "truncate_sequence", "last_sequence"))
    alone = [{**no_records, "topic": topic, "dropped_at": dropped.get(topic),
              "columns_changed_at": columns_changed_at.get(topic)}
             for topic in sorted({*dropped, *columns_changed_at} - with_records)]
    return sorted(tables + alone, key=lambda row: row["topic"])


@expressions
def _per_topic() -> tuple[tuple[Column, ...], tuple[Column, ...], tuple[Column, ...]]:
    """MirrorBatch._tables' columns read, aggregates per topic and columns out (the same
    for every batch)."""
    value = F.col("value").cast("string")
    op = F.col("op")
    truncate = F.when(op == "t", F.col("offset"))
    drop = F.when((F.col("topic") == DROPS_TOPIC) & (op == "c"), F.struct(  # a snapshot read is no drop
        F.get_json_object(value, "$.payload.after.schema_name").alias("schema"),
        F.get_json_object(value, "$.payload.after.table_name").alias("table"),
        F.get_json_object(value, "$.payload.source.sequence").alias("sequence")))
    keyed = F.col("key").isNotNull() & (op != "t") & ~F.col("keyless")
    read = (*columns(["topic", "offset", "key", "value", "headers"]),
            F.get_json_object(value, "$.payload.op").alias("op"), is_keyless(F.col("key")).alias("keyless"))
    aggregates = (
        F.max_by("value", "offset").alias("last_value"),
        # A truncate's key is its topic, a keyless change's its own (jvm/smt
        # KeyKeylessRecords): neither is the table's key.
        F.max_by("key", F.when(keyed, F.col("offset"))).alias("last_key"),
        F.min(F.when(keyed, F.col("offset"))).alias("keyed_from"),
        F.min(F.when(F.col("keyless"), F.col("offset"))).alias("keyless_from"),
        F.max_by(value, truncate).alias("last_truncate"),  # a null ordering is skipped
        F.max(op == "d").alias("deletes"),
        F.max(op == "u").alias("updates"),
        F.max(is_key_change(op, F.col("headers"), "c")).alias("moves"),
        F.max(is_key_change(op, F.col("headers"), "d")).alias("moved_away"),
        F.collect_list(drop).alias("drops"),
        F.collect_list(F.when(F.col("topic") == COLUMNS_TOPIC, value)).alias("column_changes"))
    selected = (
        *columns(["topic", "deletes", "updates", "moves", "moved_away", "keyed_from", "keyless_from"]),
        F.get_json_object(F.col("last_value").cast("string"), "$.schema").alias("value_schema"),
        F.get_json_object(F.col("last_key").cast("string"), "$.schema").alias("key_schema"),
        F.get_json_object(F.col("last_truncate"), "$.payload.source.sequence").alias("truncate_sequence"),
        F.get_json_object(F.col("last_value").cast("string"), "$.payload.source.sequence").alias("last_sequence"),
        *columns(["drops", "column_changes"]))
    return read, aggregates, selected


def _kinds(records: DataFrame, row) -> list[tuple[bool, DataFrame]]:
    """A table's records in the batch split by kind, keyless changes (True) or the others,
    the kind that comes first in the topic first (a table gains or loses its key between
    them). Truncates go with the others; a batch of one kind is not split."""
    if row["keyless_from"] is None:
        return [(False, records)]
    if row["keyed_from"] is None:
        return [(True, records)]
    keyless = is_keyless(F.col("key"))
    kinds = [(True, records.where(keyless)), (False, records.where(~keyless))]
    return kinds if row["keyless_from"] < row["keyed_from"] else kinds[::-1]


def _screened(table: TablePlan) -> tuple[list[DeadLetter], Extent | None]:
    """The table's changes that must not be applied: undecodable ones, and changes that
    repeat a source position already taken by a different change of the same key (one
    of them is wrong, and guessing which would be silent loss); and, for a keyed table,
    the `Extent` of the others. A keyless table's rows share positions (a COPY logs many
    in one WAL record) and have no key to repeat."""
    changes = table.changes
    if table.keyless:
        undecodable = changes.where(F.col(ERROR).isNotNull()).select("_topic", "_partition", "_offset", ERROR)
        return [DeadLetter(row["_topic"], row["_partition"], row["_offset"], table.name, row[ERROR])
                for row in undecodable.collect()], None
    data = [c for c in changes.columns if c not in PROVENANCE and c not in (UNCHANGED, ERROR)]
    first = changes.schema[table.keys[0]].dataType
    selected, aggregates = _screening(tuple(table.keys), tuple(data), first)
    row = changes.select(*selected).agg(*aggregates).first()
    return ([DeadLetter(r["_topic"], r["_partition"], r["_offset"], table.name, r[ERROR]) for r in row["refused"]],
            extent_of(row, first))


@expressions
def _screening(keys: tuple[str, ...], data: tuple[str, ...], first: T.DataType) -> tuple[tuple[Column, ...], tuple[Column, ...]]:
    """_screened's columns and aggregates for a table's keys, columns and first key
    column's type."""
    content = F.when(F.col(ERROR).isNull(), F.xxhash64(*[F.col(quoted(c)) for c in data], F.col("_op")))
    # A position with more than one content: its least and greatest differ. Taken over a
    # window, so that one aggregate then collects the refused and spans the rest: one pass,
    # 3 Spark jobs, where grouping the positions, joining the rare ones found back and
    # spanning the rest on their own took 6. (No distinct count, which expands the rows
    # once more; no list of each position's records, an object aggregate over every change.)
    position = columns([*keys, "_commit_lsn", "_lsn"])
    same_position = Window.partitionBy(*position)
    repeated = F.coalesce(F.min(content).over(same_position) != F.max(content).over(same_position), F.lit(False))
    selected = (*position, F.col("_topic"), F.col("_partition"), F.col("_offset"),
                F.when(F.col(ERROR).isNotNull(), F.col(ERROR))
                .when(repeated, F.lit("repeated source position with different content")).alias(ERROR))
    refused = F.col(ERROR).isNotNull()
    letters = F.collect_list(F.when(refused, F.struct("_topic", "_partition", "_offset", ERROR)))
    return selected, (letters.alias("refused"), *extent_aggregates(list(keys), first, ~refused))


def _first_line(error: Exception) -> str:
    """An error's message without Spark's SQLSTATE details and JVM stack."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _all_records(records: DataFrame, table: str, error: str) -> list[DeadLetter]:
    return [DeadLetter(r["topic"], r["partition"], r["offset"], table, error)
            for r in records.select("topic", "partition", "offset").collect()]
