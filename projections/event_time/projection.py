"""Event time: windowed aggregates with a watermark and late data, and a time-bounded join.

Input:  two append-only Delta tables, read as streams and unioned: the ledger (postings,
        event time = `event_time`, the outbox's `occurred_at`) and the bronze changelog
        (each order's and payment's first insert or snapshot row; event time =
        `placed_at` and `paid_at`). Two clocks: `ledger` (postings) and `commerce`
        (orders and payments, ordered together like the two sides of Spark's join).
Key:    per table, below.
Target: under <lake>/event_time (one catalog generation, rebuilt and swapped whole):
          inputs             every accepted event once, stamped with its watermark_before
                             (rules.py): the deterministic core, append-only
          account_hourly     tumbling 1-hour windows per account: entries, net, volume
          account_sliding    10-minute windows every 5 minutes per account
          customer_sessions  sessions of a customer's postings, 30-minute gap
          order_payments     each order with its first payment within an hour of event
                             time (interval left outer join): paid, pending or unpaid
          late_events        each (event, window) beyond the allowed lateness
        Every row has `corrections` and `emission` (early, final, correction).
Apply:  per batch, on the driver (batches of events are small), in order; each write is
        its own commit tagged txnAppId `event_time:<table>` / batch id, so a replayed
        batch changes nothing:
          1. Read the batch, the postings from the ledger as of a point of its own
             (projections/derived.py: its stream only starts batches); an order or
             payment row that does not parse goes to the dead letters.
          2. Replays: an event `inputs` already holds keeps its stamp (a crash replays
             the batch; a second insert of an order id is not a new order).
          3. The customer of each new posting's account, from the changelog's account
             rows (accounts never change owner; waiting for the changelog to have it).
          4. Stamp the new events (watermark_before, in position order) and append them
             to `inputs`; the clocks advance.
          5. Per view whose stream moved: recompute the windows, sessions or orders the
             batch's events fall in, from `inputs`; MERGE them (update only what
             differs, delete sessions a merge superseded), and in the same MERGE turn
             every stored early row whose end the watermark has now passed final
             (the sweep: a window is closed by time passing, not by an event in it).
             The MERGE's source names every row it changes, so it reads only the
             files whose statistics can hold those keys, however long the history.
          6. Insert the late (event, window) pairs into late_events (insert-only: one
             found again stays one row), and count what the table holds, for `status`.
        Everything stored is a function of the events in commit order: a rebuild from
        offset zero, with other batch boundaries, gives the same tables.
Oracle: "streaming equals batch": `check` recomputes every table in Spark batch over the
        ledger and the changelog at rest (the stamps with a window function; the views
        with `window`, `session_window` and an interval join in SQL). The join also has
        Postgres as its oracle (ORDER_PAYMENTS_SQL, in tests/e2e).
"""


from __future__ import annotations


from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections.event_time import oracle
from projections.event_time.batch import EventTimeBatch, commerce_changes
from projections.event_time.tables import KIND, LEDGER, NAME, POSITION, POSTING, source, targets
from sync.compare import Report
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.fencing import Fence
from sync.delta.reader import Readers
from sync.lake import LakePath
from sync.projection import DeltaTables, Projection, Target
from sync.streaming.stream import run_batches


class EventTime(Projection):
    """Reset after a resnapshot, as the views: the tables and checkpoint go, and the
    projection restarts from the snapshot's offsets (orders before it come back as
    snapshot rows, with commit LSN 0, so first in commit order)."""

    name = NAME
    kind = KIND

    def source(self, settings: Settings) -> DeltaTables:
        return source(settings)

    def targets(self, settings: Settings) -> list[Target]:
        return targets(settings)

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """Event time's points (sync/delta/points.py): they name its tables' versions."""
        return [points.folder(catalog.root(settings, NAME), NAME)]

    def check(self, settings: Settings, readers: Readers, conn, target: Target) -> Report:
        return oracle.check(settings, readers, target)

    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        changelog, ledger = source(settings).paths
        commerce = commerce_changes(settings, spark.readStream.format("delta").load(changelog))
        postings = (spark.readStream.format("delta").load(ledger)
                    .select(F.lit(LEDGER).alias("stream"), *POSTING, *POSITION))
        records = commerce.unionByName(postings, allowMissingColumns=True)
        return run_batches(records, NAME, EventTimeBatch(settings, fence), settings, once)


PROJECTION = EventTime()
