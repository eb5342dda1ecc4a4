"""Event time: windowed aggregates with a watermark and late data, and a time-bounded join.

Input:  two append-only Delta tables, read as streams and unioned: the ledger (postings,
        event time = `event_time`, the outbox's `occurred_at`) and the bronze changelog
        (each order's and payment's first insert or snapshot row; event time =
        `placed_at` and `paid_at`). Two clocks: `ledger` (postings) and `commerce`
        (orders and payments, ordered together like the two sides of Spark's join).
Key:    per table, below.
Target: under <lake>/event_time (one catalog generation, rebuilt and swapped whole):
          inputs             every accepted event once, stamped with its watermark_before
                             (projections/event_time/rules.py): the deterministic core, append-only
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
          1. Read the batch; an order or payment row that does not parse goes to the
             dead letters.
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

import json
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections import Target
from projections.changelog import changelog_path
from sync.delta import catalog
from projections.event_time import rules as eventtime
from sync.config import Settings
from sync.delta import deadletters
from sync.delta.commit import commit_batch
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table, merge_metrics, table_properties
from sync.errors import LakesyncError
from projections.ledger import ledger_path
from sync.streaming.progress import Progress, Steps
from sync.streaming.stream import at_or_after, run_batches, start_offsets

NAME = "event_time"
KIND = "event time"
TOPIC_PATTERN = None  # reads Delta tables, not Kafka: see `inputs`
COMMERCE = ["public.orders", "public.payments"]
LEDGER, COMMERCE_STREAM = "ledger", "commerce"
CUSTOMER_WAIT_SECONDS = 600
POSITION = ["_commit_lsn", "_lsn", "_topic", "_partition", "_offset"]
MISSING = [-1, -1, "", -1, -1]

INPUTS_SCHEMA = ("stream string, event_id string, kind string, account bigint, customer_id bigint, "
                 "currency string, order_id bigint, payment_id bigint, amount decimal(20,4), "
                 "event_time timestamp, `_commit_lsn` bigint, `_lsn` bigint, `_topic` string, "
                 "`_partition` int, `_offset` bigint, watermark_before timestamp, `_applied_at` timestamp")
WINDOW_SCHEMA = ("account bigint, currency string, window_start timestamp, window_end timestamp, entries bigint, "
                 "net_amount decimal(30,4), volume decimal(30,4), corrections bigint, emission string, "
                 "`_applied_at` timestamp")
SESSION_SCHEMA = ("customer_id bigint, session_start timestamp, session_end timestamp, last_event_at timestamp, "
                  "entries bigint, corrections bigint, emission string, `_applied_at` timestamp")
ORDER_PAYMENTS_SCHEMA = ("order_id bigint, placed_at timestamp, pay_by timestamp, payment_id bigint, "
                         "paid_at timestamp, amount decimal(12,2), time_to_pay_us bigint, payment_status string, "
                         "corrections bigint, emission string, `_applied_at` timestamp")
LATE_SCHEMA = ("view string, event_id string, key string, window_start timestamp, window_end timestamp, "
               "event_time timestamp, watermark_before timestamp, `_commit_lsn` bigint, `_lsn` bigint, "
               "`_applied_at` timestamp")


class View:
    """One table of this projection: its schema, key, end column and target name."""

    def __init__(self, table: str, target: str, kind: str, schema: str, keys: list[str], end: str = ""):
        self.table, self.target, self.kind, self.schema, self.keys, self.end = table, target, kind, schema, keys, end

    @property
    def columns(self) -> list[str]:
        return [c.split()[0].strip("`") for c in self.schema.split(", ") if not c.startswith("`_applied_at`")]


INPUTS = View("inputs", "event_time.inputs", "input", INPUTS_SCHEMA, ["stream", "event_id"])
HOURLY = View("account_hourly", "window.account_hourly", "window", WINDOW_SCHEMA, ["account", "window_start"],
              "window_end")
SLIDING = View("account_sliding", "window.account_sliding", "window", WINDOW_SCHEMA, ["account", "window_start"],
               "window_end")
SESSIONS = View("customer_sessions", "window.customer_sessions", "session", SESSION_SCHEMA,
                ["customer_id", "session_start"], "session_end")
ORDERS = View("order_payments", "join.order_payments", "join", ORDER_PAYMENTS_SCHEMA, ["order_id"], "pay_by")
LATE = View("late_events", "late.event_time", "late", LATE_SCHEMA, ["view", "event_id", "window_start"])
VIEWS = [INPUTS, HOURLY, SLIDING, SESSIONS, ORDERS, LATE]
# What `status` reads per target (sync/commands/status.py keys a target's state by its name after the first dot).
STATE_KEY = {v.table: v.target.split(".", 1)[-1] for v in VIEWS}
SETTING_PROPERTIES = ("watermark_delay_seconds", "allowed_lateness_seconds")

# The join's defining SQL on Postgres: each order with its first payment in the bound.
ORDER_PAYMENTS_SQL = """
SELECT o.id AS order_id, o.placed_at, o.placed_at + interval '1 hour' AS pay_by, p.id AS payment_id,
       p.paid_at, p.amount,
       (extract(epoch FROM p.paid_at - o.placed_at) * 1000000)::bigint AS time_to_pay_us,
       CASE WHEN p.id IS NULL THEN 'unpaid' ELSE 'paid' END AS payment_status
FROM orders o LEFT JOIN LATERAL (
    SELECT id, paid_at, amount FROM payments
    WHERE order_id = o.id AND paid_at BETWEEN o.placed_at AND o.placed_at + interval '1 hour'
    ORDER BY paid_at, id LIMIT 1) p ON true
"""


class CustomersBehind(LakesyncError):
    exit_code = 1


class SettingsChanged(LakesyncError):
    """The tables were built with another watermark delay or allowed lateness."""


def path(settings: Settings, table: str) -> str:
    return str(catalog.root(settings, NAME) / "event_time" / table)


def inputs(settings: Settings) -> list[str]:
    """The Delta tables the query streams from, in the order of its sources."""
    return [changelog_path(settings), ledger_path(settings)]


def ready(settings: Settings) -> bool:
    return all((Path(p) / "_delta_log").is_dir() for p in inputs(settings))


def targets(settings: Settings) -> list[Target]:
    sources = {"inputs": "ledger, changelog", "order_payments": "orders, payments"}
    return [Target(name=v.target, kind=v.kind, table=path(settings, v.table), keys=v.keys,
                   source=sources.get(v.table, "event_time.inputs")) for v in VIEWS]


def verify_targets(settings: Settings, conn) -> list[Target]:
    return targets(settings)


def lag_of(target, lag_by_input: dict[str, int]) -> int:
    return sum(lag_by_input.values())


def reset(settings: Settings) -> None:
    """After a resnapshot (sync/commands/resnapshot.py), as the views: the tables and checkpoint
    go, and the projection restarts from the snapshot's offsets (orders before it come
    back as snapshot rows, with commit LSN 0, so first in commit order)."""
    import shutil

    shutil.rmtree(catalog.root(settings, NAME) / "event_time", ignore_errors=True)
    shutil.rmtree(catalog.checkpoint(settings, NAME), ignore_errors=True)
    catalog.progress_file(settings, NAME).unlink(missing_ok=True)


def start(spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
    changelog, ledger = inputs(settings)
    commerce = (spark.readStream.format("delta").load(changelog)
                .where(F.col("table").isin(COMMERCE) & F.col("_op").isin("c", "r"))
                .where(at_or_after(start_offsets(settings), "_topic", "_partition", "_offset"))
                .select(F.lit(COMMERCE_STREAM).alias("stream"), "table", "key", "after", *POSITION))
    postings = (spark.readStream.format("delta").load(ledger)
                .select(F.lit(LEDGER).alias("stream"), "event_id", "account", "amount", "currency", "event_time",
                        *POSITION))
    records = commerce.unionByName(postings, allowMissingColumns=True)
    return run_batches(records, NAME, EventTimeBatch(settings, fence), settings, once)


def position_of(row) -> tuple:
    """An event's place in source commit order (a missing part sorts first, as in Spark)."""
    return tuple(m if row[c] is None else row[c] for c, m in zip(POSITION, MISSING))


def _utc(value: str) -> datetime:
    """An ISO-8601 instant (Debezium's ZonedTimestamp) as a naive UTC datetime, as Spark
    gives timestamps back in this UTC process (sync/streaming/spark.py)."""
    return datetime.fromisoformat(value).astimezone(timezone.utc).replace(tzinfo=None)


def commerce_event(table: str, after: str | None) -> dict:
    """An order-placed or payment event from a changelog row; ValueError says why not."""
    try:
        row = json.loads(after or "null")
        if table == "public.orders":
            return {"kind": "order_placed", "event_id": f"order:{int(row['id'])}", "order_id": int(row["id"]),
                    "event_time": _utc(row["placed_at"])}
        amount = Decimal(str(row["amount"]))
        if not amount.is_finite():
            raise ValueError(f"amount {row['amount']!r}")
        return {"kind": "payment", "event_id": f"payment:{int(row['id'])}", "payment_id": int(row["id"]),
                "order_id": int(row["order_id"]), "amount": amount, "event_time": _utc(row["paid_at"])}
    except (ValueError, KeyError, TypeError, InvalidOperation) as error:
        raise ValueError(f"not a {table} row with its event time ({type(error).__name__}: {error})") from None


class EventTimeBatch:
    """foreachBatch function: the steps of the module docstring, in order."""

    def __init__(self, settings: Settings, fence: Fence):
        self.settings = settings
        self.fence = fence
        self.progress = Progress(settings, NAME)
        self.delay = timedelta(seconds=settings.watermark_delay_seconds)
        self.lateness = timedelta(seconds=settings.allowed_lateness_seconds)
        self.clocks: dict[str, eventtime.Clock] | None = None   # read from `inputs` once per run
        self.customers: dict[int, int | None] = {}               # account -> customer (never changes)

    # -- step 0: the tables, the settings they were built with, the clocks --
    def _open(self, spark: SparkSession) -> None:
        wanted = {f"lakesync.{name}": str(getattr(self.settings, name)) for name in SETTING_PROPERTIES}
        for view in VIEWS:
            extra = {"delta.appendOnly": "true"} if view is INPUTS else {}
            ensure_table(spark, path(self.settings, view.table), view.schema,
                         {**extra, **wanted, **self.fence.properties})
        found = table_properties(spark, path(self.settings, INPUTS.table))
        changed = {k: found.get(k) for k in wanted if found.get(k) != wanted[k]}
        if changed:
            raise SettingsChanged(f"the event-time tables were built with {changed}, not {wanted}: run "
                                  "`lakesync rebuild event_time --swap` to rebuild them with the new settings")
        clocks = (self._read(INPUTS).groupBy("stream")
                  .agg(F.max("event_time").alias("max_event_time"), F.max(F.struct(*POSITION)).alias("position"))
                  .collect())
        self.clocks = {r["stream"]: eventtime.Clock(r["max_event_time"], position_of(r["position"])) for r in clocks}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = self.spark = batch.sparkSession
        started = time.time()
        if self.clocks is None:
            self._open(spark)
        steps = Steps()
        # Step 1: read and parse.
        rows = batch.collect()
        if not rows:
            return  # a metadata-only version of an input (a fencing stamp): nothing to do
        events, errors = [], []
        for r in rows:
            event = {c: None for c in INPUTS.columns}
            event.update({c: r[c] for c in ["stream", *POSITION]})
            if r["stream"] == LEDGER:
                event.update(kind="posting", event_id=r["event_id"], account=r["account"], amount=r["amount"],
                             currency=r["currency"], event_time=r["event_time"])
            else:
                try:
                    event.update(commerce_event(r["table"], r["after"]))
                except ValueError as error:
                    errors.append((r["_topic"], r["_partition"], r["_offset"], r["table"], str(error)))
                    continue
            event["position"] = position_of(r)
            events.append(event)
        dead = self._dead_letters(spark, batch, batch_id, errors)
        steps.done("read")
        # Step 2: replays keep their stamps; of two rows with one event id, the first counts.
        first: dict[tuple, dict] = {}
        for e in sorted(events, key=lambda e: e["position"]):
            first.setdefault((e["stream"], e["event_id"]), e)
        known = self._stored_stamps(list(first.values()))
        new = [e for key, e in first.items() if key not in known]
        steps.done("replays")
        # Step 3: customers of the new postings.
        self._resolve_customers(spark, {e["account"] for e in new if e["stream"] == LEDGER})
        for e in new:
            if e["stream"] == LEDGER:
                e["customer_id"] = self.customers[e["account"]]
        steps.done("customers")
        # Step 4: stamp and append.
        stamped, clocks = [], dict(self.clocks)
        for stream in (LEDGER, COMMERCE_STREAM):
            mine = [e for e in new if e["stream"] == stream]
            if mine:
                done, clocks[stream] = eventtime.stamp(mine, clocks.get(stream), self.delay,
                                                       lambda position, s=stream: self._max_before(s, position))
                stamped += done
        applied = {INPUTS.table: self._append_inputs(spark, batch_id, stamped)}
        self.clocks = clocks
        steps.done("stamp")
        # Steps 5 and 6: the views of the streams this batch moved, then the late events.
        batch_events = [*known.values(), *stamped]
        late = []
        postings = [e for e in batch_events if e["stream"] == LEDGER]
        if postings:
            wm = self.clocks[LEDGER].watermark(self.delay)
            for view, windows_of in ((HOURLY, eventtime.tumbling), (SLIDING, eventtime.sliding)):
                applied[view.table], found = self._windows(spark, batch_id, view, windows_of, postings, wm)
                late += found
                steps.done(view.table)
            applied[SESSIONS.table], found = self._sessions(spark, batch_id, postings, wm)
            late += found
            steps.done(SESSIONS.table)
        commerce = [e for e in batch_events if e["stream"] == COMMERCE_STREAM]
        if commerce:
            applied[ORDERS.table], found = self._orders(spark, batch_id, commerce,
                                                        self.clocks[COMMERCE_STREAM].watermark(self.delay))
            late += found
            steps.done(ORDERS.table)
        applied[LATE.table] = self._insert_late(spark, batch_id, late)
        # The late events held, counted (not summed per batch: a batch replayed after a
        # crash between its commit and this record inserts nothing, and counts right).
        held = {STATE_KEY[LATE.table]: self._read(LATE).count()} if late else None
        steps.done(LATE.table)
        self.progress.record(batch_id, {STATE_KEY[t]: n for t, n in applied.items()}, started,
                             dead_letters_by_table={STATE_KEY[INPUTS.table]: dead} if dead else None,
                             step_seconds=steps.seconds, late_events_by_table=held,
                             watermarks={s: c.watermark(self.delay).isoformat() + "Z" for s, c in self.clocks.items()})

    # -- reading what is stored --
    def _read(self, view: View) -> DataFrame:
        return self.spark.read.format("delta").load(path(self.settings, view.table))

    def _stored_stamps(self, events: list[dict]) -> dict[tuple, dict]:
        """The events `inputs` already holds, with their stored columns and stamps: a
        posting at or below its clock's position (a replay), and any order or payment
        (its id may come again: an order deleted, then inserted with the same id)."""
        maybe = [e for e in events if e["stream"] == COMMERCE_STREAM
                 or ((clock := self.clocks.get(e["stream"])) and e["position"] <= clock.position)]
        if not maybe:
            return {}
        stored = {}  # (event ids are unique across the streams: uuids, order:N, payment:N)
        for r in self._read(INPUTS).where(F.col("event_id").isin([e["event_id"] for e in maybe])).collect():
            row = r.asDict()
            row["position"] = position_of(row)
            stored[(row["stream"], row["event_id"])] = row
        return stored

    def _max_before(self, stream: str, position: tuple) -> datetime | None:
        """The greatest stored event time of `stream` before `position` (for an event that
        arrived after a later one: see projections/event_time/rules.stamp)."""
        before = None
        for n in reversed(range(len(POSITION))):  # lexicographic, last part first
            column, value = F.coalesce(F.col(POSITION[n]), F.lit(MISSING[n])), F.lit(position[n])
            before = column < value if before is None else (column < value) | ((column == value) & before)
        return self._read(INPUTS).where((F.col("stream") == stream) & before).agg(F.max("event_time")).first()[0]

    def _resolve_customers(self, spark: SparkSession, accounts: set[int]) -> None:
        """Step 3: each account's customer from its first row in the changelog, waiting
        for the changelog to hold it (the ledger and the changelog are fed by separate
        queries; an account is created before its first posting)."""
        missing = accounts - set(self.customers)
        deadline = time.monotonic() + CUSTOMER_WAIT_SECONDS
        while missing:
            account_id = F.get_json_object("key", "$.id").cast("bigint")
            found = (spark.read.format("delta").load(changelog_path(self.settings))
                     .where((F.col("table") == "public.accounts") & F.col("after").isNotNull())
                     .where(account_id.isin(sorted(missing)))
                     .groupBy(account_id.alias("account"))
                     .agg(F.min_by(F.get_json_object("after", "$.customer_id").cast("bigint"),
                                   F.struct("_commit_lsn", "_lsn")).alias("customer_id"))
                     .collect())
            self.customers.update({r["account"]: r["customer_id"] for r in found})
            missing -= {r["account"] for r in found}
            if missing and time.monotonic() > deadline:
                raise CustomersBehind(f"the changelog has no row of accounts {sorted(missing)[:10]} after "
                                      f"{CUSTOMER_WAIT_SECONDS} s; event time waits for it")
            if missing:
                self.fence.check()
                time.sleep(0.25)

    # -- writing --
    def _frame(self, spark: SparkSession, view: View, rows: list[dict]) -> DataFrame:
        now = datetime.now(timezone.utc)
        return spark.createDataFrame([tuple(r.get(c) for c in view.columns) + (now,) for r in rows], view.schema)

    def _dead_letters(self, spark: SparkSession, batch: DataFrame, batch_id: int, errors: list) -> int:
        if not errors:
            return 0
        records = batch.where(F.col("stream") == COMMERCE_STREAM).select(
            F.col("key").cast("binary").alias("key"), F.col("after").cast("binary").alias("value"),
            F.col("_topic").alias("topic"), F.col("_partition").alias("partition"),
            F.col("_offset").alias("offset"))
        return deadletters.write(spark, self.settings, NAME, batch_id, records, errors, self.fence)

    def _append_inputs(self, spark: SparkSession, batch_id: int, stamped: list[dict]) -> int:
        if not stamped:
            return 0
        frame = self._frame(spark, INPUTS, stamped)
        commit_batch(spark, f"{NAME}:{INPUTS.table}", batch_id,
                     lambda: frame.write.format("delta").mode("append").save(path(self.settings, INPUTS.table)),
                     self.fence, self.settings.fault)
        return len(stamped)

    def _merge(self, spark: SparkSession, batch_id: int, view: View, rows: list[dict], watermark: datetime,
               replaced: str | None = None, swept: dict[str, str] | None = None) -> int:
        """MERGE recomputed rows: update what differs, insert what is new, delete stored
        rows `replaced` selects that the recompute no longer has, and sweep: stored early
        rows whose end the watermark has passed become final."""
        source = self._frame(spark, view, rows)
        on = " AND ".join(f"t.{k} = s.{k}" for k in view.keys)
        compared = [c for c in view.columns if c not in view.keys]
        differs = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in compared)
        mark = f"timestamp'{watermark.isoformat(sep=' ')}'"
        builder = (DeltaTable.forPath(spark, path(self.settings, view.table)).alias("t").merge(source.alias("s"), on)
                   .whenMatchedUpdate(condition=differs, set={c: f"s.{c}" for c in [*compared, "_applied_at"]})
                   .whenNotMatchedInsertAll())
        if replaced:
            builder = builder.whenNotMatchedBySourceDelete(condition=replaced)
        builder = builder.whenNotMatchedBySourceUpdate(
            condition=f"t.emission = '{eventtime.EARLY}' AND t.{view.end} <= {mark}",
            set={"emission": f"'{eventtime.FINAL}'", "_applied_at": "current_timestamp()", **(swept or {})})
        metrics = {}
        commit_batch(spark, f"{NAME}:{view.table}", batch_id, lambda: metrics.update(merge_metrics(builder.execute())),
                     self.fence, self.settings.fault)
        return int(metrics.get("num_affected_rows", 0))

    def _windows(self, spark, batch_id, view: View, windows_of, postings: list[dict], watermark: datetime):
        """Step 5 for a windowed view: the windows the batch's postings fall in,
        recomputed from every stored posting of their accounts in their time range."""
        wanted = {(e["account"], start) for e in postings for start, _ in windows_of(e["event_time"])}
        low = min(start for _, start in wanted)
        high = max(end for e in postings for _, end in windows_of(e["event_time"]))
        stored = (self._read(INPUTS).where((F.col("stream") == LEDGER)
                                           & F.col("account").isin(sorted({a for a, _ in wanted}))
                                           & (F.col("event_time") >= F.lit(low)) & (F.col("event_time") < F.lit(high)))
                  .collect())
        rows, late = eventtime.window_rows((r.asDict() for r in stored), windows_of, watermark, self.lateness)
        rows = [row for key, row in rows.items() if key in wanted]
        return self._merge(spark, batch_id, view, rows, watermark), [dict(r, view=view.table) for r in late]

    def _sessions(self, spark, batch_id, postings: list[dict], watermark: datetime):
        """Step 5 for sessions: every session of the customers the batch's postings
        belong to, recomputed; a stored session a bridging posting merged is deleted."""
        customers = sorted({e["customer_id"] for e in postings if e["customer_id"] is not None})
        rows, late = [], []
        if customers:
            stored = self._read(INPUTS).where((F.col("stream") == LEDGER) & F.col("customer_id").isin(customers))
            by_customer: dict[int, list[dict]] = {}
            for r in stored.collect():
                entry = r.asDict()
                entry["position"] = position_of(entry)
                by_customer.setdefault(entry["customer_id"], []).append(entry)
            for entries in by_customer.values():
                found, gone = eventtime.session_rows(entries, eventtime.SESSION_GAP, watermark, self.lateness)
                rows += found
                late += [dict(r, view=SESSIONS.table) for r in gone]
        replaced = f"t.customer_id IN ({', '.join(map(str, customers))})" if customers else None
        return self._merge(spark, batch_id, SESSIONS, rows, watermark, replaced=replaced), late

    def _orders(self, spark, batch_id, events: list[dict], watermark: datetime):
        """Step 5 for the join: the orders of the batch's orders and payments, each
        recomputed from its stored order and payment events."""
        order_ids = sorted({e["order_id"] for e in events})
        stored: dict[int, dict] = {}
        payments: dict[int, list[dict]] = {}
        for r in self._read(INPUTS).where((F.col("stream") == COMMERCE_STREAM)
                                          & F.col("order_id").isin(order_ids)).collect():
            if r["kind"] == "order_placed":
                stored[r["order_id"]] = r.asDict()
            else:
                payments.setdefault(r["order_id"], []).append(r.asDict())
        rows, late = [], []
        for order_id, order in stored.items():  # (a payment of an order placed before a resnapshot: no order)
            row, gone = eventtime.order_row(order, payments.get(order_id, []), watermark, self.lateness)
            rows += [row] if row else []
            late += [dict(r, view=ORDERS.table) for r in gone]
        swept = {"payment_status": f"CASE WHEN t.payment_status = '{eventtime.PENDING}' THEN '{eventtime.UNPAID}' "
                                   "ELSE t.payment_status END"}
        return self._merge(spark, batch_id, ORDERS, rows, watermark, swept=swept), late

    def _insert_late(self, spark: SparkSession, batch_id: int, late: list[dict]) -> int:
        """Step 6: insert-only, so a late pair found again (a replay, a recompute) stays
        one row; returns how many were new."""
        if not late:
            return 0
        source = self._frame(spark, LATE, late)
        on = " AND ".join(f"t.{k} = s.{k}" for k in LATE.keys)
        metrics = {}
        builder = (DeltaTable.forPath(spark, path(self.settings, LATE.table)).alias("t")
                   .merge(source.alias("s"), on).whenNotMatchedInsertAll())
        commit_batch(spark, f"{NAME}:{LATE.table}", batch_id, lambda: metrics.update(merge_metrics(builder.execute())),
                     self.fence, self.settings.fault)
        return int(metrics.get("num_inserted_rows", 0))


# -- the oracle: every table recomputed in Spark batch over the sources at rest --

def check(settings: Settings, spark: SparkSession, conn, target: Target):
    """Streaming equals batch: the table `target` names against its recomputation."""
    from sync.commands.verify import compare

    view = next(v for v in VIEWS if v.target == target.name)
    types = {"bigint": "bigint", "int": "integer", "string": "text", "timestamp": "timestamp without time zone"}
    kinds = [c.split()[1] for c in view.schema.split(", ") if not c.startswith("`_applied_at`")]
    columns = [types.get(k, "numeric") for k in kinds]
    table = path(settings, view.table)
    expected = Expected(settings, spark).rows(view) if ready(settings) else []
    actual = ((tuple(r) for r in spark.read.format("delta").load(table).select(*view.columns).toLocalIterator())
              if DeltaTable.isDeltaTable(spark, table) else [])
    return compare(target, expected, actual, view.columns, columns, view.keys)


def _spark(duration: timedelta) -> str:
    """A duration as Spark's window functions and INTERVAL literals take it."""
    return f"{int(duration.total_seconds())} seconds"


HOURLY_SHAPE = (_spark(eventtime.HOURLY),)
SLIDING_SHAPE = (_spark(eventtime.SLIDE_SIZE), _spark(eventtime.SLIDE_STEP))


class Expected:
    """The batch definitions, written apart from the streaming path (projections/event_time/rules.py):
    stamps by a window function over commit order, windows by Spark's `window` and
    `session_window`, the join as SQL. Only a session's `corrections` (a replay in
    arrival order) reuses the pure function."""

    def __init__(self, settings: Settings, spark: SparkSession):
        self.settings, self.spark = settings, spark
        self.delay = F.expr(f"INTERVAL {settings.watermark_delay_seconds} SECONDS")
        self.lateness = F.expr(f"INTERVAL {settings.allowed_lateness_seconds} SECONDS")
        self.stamped = self._stamped().localCheckpoint()
        marks = self.stamped.groupBy("stream").agg(F.max("event_time").alias("mark")).collect()
        delay = timedelta(seconds=settings.watermark_delay_seconds)
        self.watermarks = {r["stream"]: r["mark"] - delay for r in marks}

    def rows(self, view: View):
        frame = {INPUTS.table: lambda: self.stamped, HOURLY.table: lambda: self._windows(*HOURLY_SHAPE),
                 SLIDING.table: lambda: self._windows(*SLIDING_SHAPE), ORDERS.table: self._orders,
                 LATE.table: self._late}.get(view.table)
        if frame is None:
            return self._sessions()
        return (tuple(r) for r in frame().select(*view.columns).toLocalIterator())

    def _stamped(self) -> DataFrame:
        changelog = self.spark.read.format("delta").load(changelog_path(self.settings))
        key_id = F.get_json_object("key", "$.id").cast("bigint")
        owners = (changelog.where((F.col("table") == "public.accounts") & F.col("after").isNotNull())
                  .groupBy(key_id.alias("account"))
                  .agg(F.min_by(F.get_json_object("after", "$.customer_id").cast("bigint"),
                                F.struct("_commit_lsn", "_lsn")).alias("customer_id")))
        postings = (self.spark.read.format("delta").load(ledger_path(self.settings)).join(owners, "account", "left")
                    .select(F.lit(LEDGER).alias("stream"), "event_id", F.lit("posting").alias("kind"), "account",
                            "customer_id", "currency", "amount", "event_time", *POSITION))
        rows = (changelog.where(F.col("table").isin(COMMERCE) & F.col("_op").isin("c", "r"))
                .where(at_or_after(start_offsets(self.settings), "_topic", "_partition", "_offset")))
        field = lambda name: F.get_json_object("after", f"$.{name}")  # noqa: E731
        orders = rows.where(F.col("table") == "public.orders").select(
            F.concat(F.lit("order:"), key_id).alias("event_id"), F.lit("order_placed").alias("kind"),
            key_id.alias("order_id"), F.try_to_timestamp(field("placed_at")).alias("event_time"), *POSITION)
        payments = rows.where(F.col("table") == "public.payments").select(
            F.concat(F.lit("payment:"), key_id).alias("event_id"), F.lit("payment").alias("kind"),
            field("order_id").cast("bigint").alias("order_id"), key_id.alias("payment_id"),
            field("amount").try_cast("decimal(20,4)").alias("amount"),
            F.try_to_timestamp(field("paid_at")).alias("event_time"), *POSITION)
        commerce = orders.unionByName(payments, allowMissingColumns=True).withColumn("stream", F.lit(COMMERCE_STREAM))
        order = [F.coalesce(F.col(c), F.lit(m)) for c, m in zip(POSITION, MISSING)]
        first = Window.partitionBy("event_id").orderBy(*order)
        commerce = (commerce.where(F.col("event_time").isNotNull())  # (one that does not parse is a dead letter)
                    .withColumn("n", F.row_number().over(first)).where("n = 1").drop("n"))
        events = postings.unionByName(commerce, allowMissingColumns=True)
        before = Window.partitionBy("stream").orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
        return events.withColumn("watermark_before", F.max("event_time").over(before) - self.delay)

    def _ledger(self) -> DataFrame:
        return self.stamped.where(F.col("stream") == LEDGER)

    def _mark(self, stream: str):
        mark = self.watermarks.get(stream)
        return F.lit(mark) if mark is not None else F.lit(None).cast("timestamp")

    def _emission(self, end: str, stream: str):
        mark = self._mark(stream)
        return (F.when(mark.isNull() | (mark < F.col(end)), eventtime.EARLY)
                .when(F.col("corrections") > 0, eventtime.CORRECTION).otherwise(eventtime.FINAL))

    def _windowed(self, *shape: str) -> DataFrame:
        return (self._ledger().withColumn("w", F.window("event_time", *shape))
                .withColumn("window_start", F.col("w.start")).withColumn("window_end", F.col("w.end")))

    def _windows(self, *shape: str) -> DataFrame:
        wb = F.col("watermark_before")
        accepted = self._windowed(*shape).where(wb.isNull() | (wb < F.col("window_end") + self.lateness))
        rows = accepted.groupBy("account", "window_start", "window_end").agg(
            F.first("currency").alias("currency"), F.count("*").alias("entries"),
            F.sum("amount").alias("net_amount"), F.sum(F.abs("amount")).alias("volume"),
            F.count_if(wb >= F.col("window_end")).alias("corrections"))
        return rows.withColumn("emission", self._emission("window_end", LEDGER))

    def _sessions(self):
        gap = F.expr(f"INTERVAL {_spark(eventtime.SESSION_GAP)}")
        wb = F.col("watermark_before")
        accepted = self._ledger().where(F.col("customer_id").isNotNull()
                                        & (wb.isNull() | (wb < F.col("event_time") + gap + self.lateness)))
        sessions = accepted.groupBy("customer_id", F.session_window("event_time", _spark(eventtime.SESSION_GAP))
                                    .alias("s")).agg(
            F.max("event_time").alias("last_event_at"), F.count("*").alias("entries"),
            F.collect_list(F.struct("event_time", "watermark_before", *POSITION)).alias("arrivals"))
        mark = self.watermarks.get(LEDGER)
        for r in sessions.toLocalIterator():
            arrivals = [dict(a.asDict(), position=position_of(a)) for a in r["arrivals"]]
            corrections = eventtime.session_corrections(arrivals, eventtime.SESSION_GAP)
            yield (r["customer_id"], r["s"]["start"], r["s"]["end"], r["last_event_at"], r["entries"], corrections,
                   eventtime.emission(r["s"]["end"], corrections, mark))

    def _orders_and_payments(self):
        bound = F.expr(f"INTERVAL {_spark(eventtime.PAYMENT_BOUND)}")
        orders = self.stamped.where(F.col("kind") == "order_placed").select(
            "order_id", F.col("event_id").alias("order_event"), F.col("event_time").alias("placed_at"),
            (F.col("event_time") + bound).alias("pay_by"), F.col("watermark_before").alias("order_wb"),
            F.col("_commit_lsn").alias("order_commit_lsn"), F.col("_lsn").alias("order_lsn"))
        orders = orders.withColumn("order_late", F.col("order_wb") >= F.col("pay_by") + self.lateness)
        payments = self.stamped.where(F.col("kind") == "payment").select(
            "order_id", "payment_id", "event_id", F.col("event_time").alias("paid_at"), "amount",
            "watermark_before", "_commit_lsn", "_lsn")
        in_bound = payments.join(orders, "order_id").where(F.col("paid_at").between(F.col("placed_at"),
                                                                                     F.col("pay_by")))
        payment_late = F.col("order_late") | (F.col("watermark_before") >= F.col("pay_by") + self.lateness)
        return orders, in_bound.withColumn("payment_late", F.coalesce(payment_late, F.lit(False)))

    def _orders(self) -> DataFrame:
        orders, in_bound = self._orders_and_payments()
        accepted = in_bound.where(~F.col("payment_late")).select("order_id", "payment_id", "paid_at", "amount",
                                                                  "watermark_before")
        joined = (orders.where(~F.coalesce(F.col("order_late"), F.lit(False))).join(accepted, "order_id", "left")
                  .groupBy("order_id", "placed_at", "pay_by")
                  .agg(F.min_by(F.struct("payment_id", "paid_at", "amount"), F.struct("paid_at", "payment_id"))
                       .alias("m"), F.count_if(F.col("watermark_before") >= F.col("pay_by")).alias("corrections")))
        mark = self._mark(COMMERCE_STREAM)
        return joined.select(
            "order_id", "placed_at", "pay_by", F.col("m.payment_id").alias("payment_id"),
            F.col("m.paid_at").alias("paid_at"), F.col("m.amount").cast("decimal(12,2)").alias("amount"),
            (F.unix_micros(F.col("m.paid_at")) - F.unix_micros("placed_at")).alias("time_to_pay_us"),
            F.when(F.col("m.payment_id").isNotNull(), eventtime.PAID)
             .when(mark >= F.col("pay_by"), eventtime.UNPAID).otherwise(eventtime.PENDING).alias("payment_status"),
            "corrections", self._emission("pay_by", COMMERCE_STREAM).alias("emission"))

    def _late(self) -> DataFrame:
        wb = F.col("watermark_before")
        gap = F.expr(f"INTERVAL {_spark(eventtime.SESSION_GAP)}")
        late = []
        for view, shape in ((HOURLY, HOURLY_SHAPE), (SLIDING, SLIDING_SHAPE)):
            late.append(self._windowed(*shape).where(wb >= F.col("window_end") + self.lateness).select(
                F.lit(view.table).alias("view"), "event_id", F.col("account").cast("string").alias("key"),
                "window_start", "window_end", "event_time", "watermark_before", "_commit_lsn", "_lsn"))
        late.append(self._ledger().where(F.col("customer_id").isNotNull()
                                         & (wb >= F.col("event_time") + gap + self.lateness)).select(
            F.lit(SESSIONS.table).alias("view"), "event_id", F.col("customer_id").cast("string").alias("key"),
            F.col("event_time").alias("window_start"), (F.col("event_time") + gap).alias("window_end"),
            "event_time", "watermark_before", "_commit_lsn", "_lsn"))
        orders, in_bound = self._orders_and_payments()
        late.append(orders.where(F.col("order_late")).select(
            F.lit(ORDERS.table).alias("view"), F.col("order_event").alias("event_id"),
            F.col("order_id").cast("string").alias("key"), F.col("placed_at").alias("window_start"),
            F.col("pay_by").alias("window_end"), F.col("placed_at").alias("event_time"),
            F.col("order_wb").alias("watermark_before"), F.col("order_commit_lsn").alias("_commit_lsn"),
            F.col("order_lsn").alias("_lsn")))
        late.append(in_bound.where(F.col("payment_late")).select(
            F.lit(ORDERS.table).alias("view"), "event_id", F.col("order_id").cast("string").alias("key"),
            F.col("placed_at").alias("window_start"), F.col("pay_by").alias("window_end"),
            F.col("paid_at").alias("event_time"), "watermark_before", "_commit_lsn", "_lsn"))
        result = late[0]
        for frame in late[1:]:
            result = result.unionByName(frame)
        return result
