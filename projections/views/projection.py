"""Views: the tables no single source table holds, kept current by one streaming query.

Input:  two append-only Delta tables, read as streams and unioned: the bronze changelog
        (projections/changelog.py; the changes of customers, orders, order_items and
        accounts) and the ledger (projections/ledger/; new entries, read at a point of
        the ledger's: its stream only starts batches, step 1). Neither is ever
        compacted, so a rebuild from version zero sees every version of every row.
Key:    per view (see each module): customer id and valid-from position, order id,
        customer id, event id.
Target: four Delta tables, one module each in this package (context.py is what a batch
        hands them):
          customer_history        SCD type 2 of customers
          ledger_enriched         each ledger entry with its customer as of the entry
                                  (temporal stream-table join)
          order_docs              one search-style document per order
          customer_order_summary  per customer: orders, lifetime value
Apply:  per batch, in order (each step commits on its own, tagged txnAppId
        `views:<view>` / batch id, so a replayed batch changes nothing); steps 2-3 and
        steps 4-6 share nothing, so the two run at once, each on a Spark session of its
        own (sync/streaming/batch.py `concurrently`):
          1. Wait until the mirrors have applied every Kafka record the batch's changelog
             rows came from: the table-table views read the mirrors for the current state
             of the keys a change touches, and must not read them before the change.
             Then decide what the batch reads (projections/derived.py): the mirrors and
             the ledger as of points where they stand with the changelog version read,
             and the ledger's new entries from there, not from the ledger's stream; the
             views' point, published after step 6, names those versions.
          2. customer_history: the batch's customer changes become versions.
          3. ledger_enriched: the batch's new entries, and the entries a new customer
             version or account change may re-enrich, joined with the history.
          4. order_docs, prepared: the orders the batch touched (directly, through a
             line, or through their customer), recomputed from the mirrors.
          5. customer_order_summary: the customers whose orders or attributes changed,
             recomputed from the documents as step 4 leaves them and the customers mirror.
          6. order_docs, written; then pushed to the search index.
        A crash between two commits replays the batch, and each step still finds what
        it needs: step 3 takes the new versions from the batch itself, not from what the
        history did not hold yet; step 5 commits before step 6, so the customer an order
        has just left is still in the documents.
        Only the affected keys are recomputed; no step scans its whole view, and a step
        whose inputs the batch does not hold (context.py `Contents`, from step 1's
        aggregate) is skipped.
Oracle: each view's defining SQL on Postgres (order_docs, customer_order_summary, and
        the current versions of customer_history); the enriched ledger is recomputed in
        batch over the ledger and the whole history at rest ("streaming equals batch").
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections import derived
from projections.changelog import changelog_path
from projections.ledger import ledger_path
from projections.mirrors import NAME as MIRRORS
from projections.mirrors import target as mirror_target
from projections.views import customer_history, customer_order_summary, ledger_enriched, order_docs
from projections.views.context import Contents, Context
from sync import search
from sync.cdc.ordering import spark_order
from sync.compare import Report
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.commit import BatchCommit
from sync.delta.fencing import Fence
from sync.delta.reader import Readers
from sync.errors import LakesyncError
from sync.lake import LakePath
from sync.projection import DeltaTables, Projection, Target
from sync.streaming.batch import Batch
from sync.streaming.offsets import processed_offsets
from sync.streaming.progress import Outcome, Steps
from sync.streaming.stream import at_or_after, run_batches, start_offsets

NAME = "views"
KIND = "view"
VIEWS = [customer_history, ledger_enriched, order_docs, customer_order_summary]
TABLES = ["public.customers", "public.orders", "public.order_items", "public.accounts"]
MIRROR_WAIT_SECONDS = 600


class MirrorsBehind(LakesyncError):
    exit_code = 1


class Views(Projection):
    name = NAME
    kind = KIND

    def source(self, settings: Settings) -> DeltaTables:
        """The changelog and the ledger, in the order of the query's sources."""
        return DeltaTables((changelog_path(settings), ledger_path(settings)))

    def targets(self, settings: Settings) -> list[Target]:
        return [t for view in VIEWS for t in view.targets(settings)]

    def check(self, settings: Settings, readers: Readers, conn, target: Target) -> Report:
        """verify's comparison for the targets without oracle SQL: the enriched ledger (the
        join recomputed at rest, in Spark) and the search index (its documents against
        DOCS_SQL)."""
        if target.name == order_docs.INDEX_TARGET:
            return order_docs.check_index(settings, conn, target)
        return ledger_enriched.check(settings, readers.spark, conn, target)

    def checks_with_spark(self, target: Target) -> bool:
        return target.name != order_docs.INDEX_TARGET

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """The views' points (sync/delta/points.py): they name their tables' versions."""
        return [points.folder(catalog.root(settings, NAME), NAME)]

    def reset(self, settings: Settings) -> None:
        """After a resnapshot (sync/commands/resnapshot.py) the views rebuild from the new
        snapshot on, and the search index goes with them. A snapshot read has no commit
        position that orders it after the changes before the gap, so the views cannot be
        carried across it: the customer history restarts at the snapshot (the versions
        before it stay in the changelog), and ledger entries older than the snapshot are
        enriched with the customer as snapshotted."""
        if settings.search_url:
            search.drop_index(settings.search_url, order_docs.INDEX)

    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        changelog, ledger = self.source(settings).paths
        changes = _changes(settings, spark.readStream.format("delta").load(changelog))
        entries = (spark.readStream.format("delta").load(ledger)
                   .select(F.lit("entry").alias("kind"), "event_id", "account", "_commit_lsn", "_lsn"))
        records = changes.unionByName(entries, allowMissingColumns=True)
        return run_batches(records, NAME, ViewsBatch(settings, fence), settings, once)


def _changes(settings: Settings, changelog: DataFrame) -> DataFrame:
    """The changelog's rows as the views read them (its stream, or its versions read again)."""
    return (changelog.where(F.col("table").isin(TABLES) & F.col("_op").isin("c", "u", "d", "r"))
            .where(at_or_after(start_offsets(settings), "_topic", "_partition", "_offset"))
            .select(F.lit("change").alias("kind"), "table", "_op", "key", "after", "_commit_lsn", "_lsn",
                    "_source_ts", "_topic", "_partition", "_offset"))


def _reach(changes: DataFrame) -> list:
    """Per source table and Kafka partition of `changes`: its last offset and position."""
    return (changes.groupBy("table", "_topic", "_partition")
            .agg(F.max("_offset").alias("last"), F.max(F.struct("_commit_lsn", "_lsn")).alias("high")).collect())


PROJECTION = Views()


class ViewsBatch(Batch):
    """The steps of the module docstring, in order."""

    def __init__(self, settings: Settings, fence: Fence):
        super().__init__(NAME, settings, fence)
        self.mirrors = [mirror_target(settings, table.removeprefix("public.")) for table in TABLES]  # read by the views

    def open(self, spark: SparkSession) -> None:
        for view in VIEWS:
            view.ensure(spark, self.settings, self.fence)

    def apply(self, batch: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome | None:
        records = batch.localCheckpoint(eager=True)
        changes = records.where("kind = 'change'")
        # One job for what the batch holds: the Kafka offsets its changes came from (step 1),
        # the tables they are of, whether it has entries, its latest position (`Contents`).
        groups = (records.groupBy("kind", "table", "_topic", "_partition")
                  .agg(F.max("_offset").alias("last"), F.max(F.struct("_commit_lsn", "_lsn")).alias("high"))
                  .collect())
        reach = [g for g in groups if g["kind"] == "change"]
        steps.done("read")
        self._wait_for_mirrors({(r["_topic"], r["_partition"]): r["last"] + 1 for r in reach})
        steps.done("wait_for_mirrors")
        # What the batch reads at which versions (projections/derived.py): the entries
        # from the ledger as of a point of its own, else from its stream.
        read = derived.reading(commit.spark, self.settings, NAME, commit.batch_id, self.mirrors)
        if read is None:
            entries = records.where("kind = 'entry'")
            has_entries = any(g["kind"] == "entry" for g in groups)
        else:
            entries = derived.entries(commit.spark, read).localCheckpoint()
            has_entries = not entries.isEmpty()
            # The changelog's rows through the place the batch stands at (projections/derived.py).
            to_place = derived.changes(commit.spark, self.settings, read, changes,
                                       lambda changelog: _changes(self.settings, changelog))
            if to_place is not changes:
                changes = to_place.localCheckpoint()
                reach = _reach(changes)
        steps.done("reading")
        entries = entries.select("event_id", "account", "_commit_lsn", "_lsn")
        contents = Contents(tables=frozenset(g["table"].removeprefix("public.") for g in reach), entries=has_entries,
                            high=max((tuple(g["high"]) for g in reach), key=spark_order, default=None))
        pins = read.pins if read else None
        if not reach and not contents.entries:  # a metadata-only version of an input (a fencing stamp)
            derived.publish(self.settings, NAME, commit.batch_id, read, PROJECTION.targets(self.settings), self.fence)
            # (the views stand where those versions are too)
            return Outcome(applied={}, stopped_short=True) if read and read.holds else None

        def customers_chain(chain: BatchCommit) -> tuple[dict, Steps]:  # steps 2-3
            context, chain_steps = Context(chain, self.settings, changes, entries, contents, pins), Steps()
            applied = {customer_history: customer_history.apply(context)}
            chain_steps.done(customer_history.NAME)
            applied[ledger_enriched] = ledger_enriched.apply(context)
            chain_steps.done(ledger_enriched.NAME)
            return applied, chain_steps

        def orders_chain(chain: BatchCommit) -> tuple[dict, Steps]:  # steps 4-6
            context, chain_steps = Context(chain, self.settings, changes, entries, contents, pins), Steps()
            documents = order_docs.prepare(context)
            chain_steps.done("order_docs_prepare")
            applied = {customer_order_summary: customer_order_summary.apply(context)}
            chain_steps.done(customer_order_summary.NAME)
            applied[order_docs] = order_docs.commit(context, documents)
            chain_steps.done(order_docs.NAME)
            return applied, chain_steps

        applied = {}
        for chain_applied, chain_steps in self.concurrently(commit, [customers_chain, orders_chain]):
            applied.update(chain_applied)
            steps.add(chain_steps)
        steps.done("views")
        derived.publish(self.settings, NAME, commit.batch_id, read, PROJECTION.targets(self.settings), self.fence)
        # Recorded under the key `status` reads each view's target by (history.customers: customers).
        return Outcome(applied={view.targets(self.settings)[0].state_key: rows for view, rows in applied.items()},
                       stopped_short=bool(read and read.holds))

    def _wait_for_mirrors(self, needed: dict[tuple[str, int], int]) -> None:
        deadline = time.monotonic() + MIRROR_WAIT_SECONDS
        checkpoint = catalog.checkpoint(self.settings, MIRRORS)
        while True:
            done = processed_offsets(checkpoint)
            behind = {tp: end for tp, end in needed.items() if done.get(tp, 0) < end}
            if not behind:
                return
            if time.monotonic() > deadline:
                raise MirrorsBehind(f"the mirrors have not applied {sorted(behind)} after "
                                    f"{MIRROR_WAIT_SECONDS} s; the views wait for them")
            self.fence.check()
            time.sleep(0.25)
