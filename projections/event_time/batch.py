"""Event time's streaming batch: the steps of the projection's docstring
(projections/event_time/projection.py), in order."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from projections import derived
from projections.changelog import changelog_path
from projections.views.projection import NAME as VIEWS_PROJECTION
from projections.event_time import rules as eventtime
from projections.event_time.tables import (COMMERCE, COMMERCE_STREAM, HOURLY, INPUTS, LATE, LEDGER, MISSING, NAME,
                                           ORDERS, POSITION, SESSIONS, SETTING_PROPERTIES, SLIDING, STATE_KEY, VIEWS,
                                           View, POSTING, commerce_event, path, position_of, targets)
from sync.config import Settings
from sync.delta import deadletters
from sync.delta.commit import BatchCommit
from sync.delta.deadletters import DeadLetter
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table, table_properties
from sync.errors import LakesyncError
from sync.streaming.batch import Batch
from sync.streaming.progress import Outcome, Steps
from sync.streaming.spark import one_of
from sync.streaming.stream import at_or_after, start_offsets

CUSTOMER_WAIT_SECONDS = 600  # how long step 3 waits for the changelog to hold an account
# What a MERGE does with each row of its source (`_merge`).
UPSERT, DELETE, SWEEP = "upsert", "delete", "sweep"


# The windowed views of the postings, each with the windows a time falls in.
WINDOWED = ((HOURLY, eventtime.tumbling), (SLIDING, eventtime.sliding))


def _window_span(postings: list[dict], windows_of) -> tuple[datetime, datetime]:
    """From the earliest start to the latest end of the windows `postings` fall in."""
    windows = [window for e in postings for window in windows_of(e["event_time"])]
    return min(start for start, _ in windows), max(end for _, end in windows)


def _customers(postings: list[dict]) -> list[int]:
    return sorted({e["customer_id"] for e in postings if e["customer_id"] is not None})


def _within(view: View, keys: list[tuple]) -> list[str]:
    """Conditions on a view's stored rows that hold for every one of `keys`: per key column,
    its integers as an IN list or the range of its times, so that a MERGE's target side
    reads only the files whose statistics allow one of them."""
    found = []
    for n, column in enumerate(view.keys):
        values = {key[n] for key in keys}
        if all(isinstance(v, int) for v in values):
            found.append(f"t.{column} IN ({', '.join(map(str, sorted(values)))})")
        elif all(isinstance(v, datetime) for v in values):
            found.append(f"t.{column} BETWEEN timestamp'{min(values).isoformat(sep=' ')}' "
                         f"AND timestamp'{max(values).isoformat(sep=' ')}'")
    return found


class CustomersBehind(LakesyncError):
    exit_code = 1


class SettingsChanged(LakesyncError):
    """The tables were built with another watermark delay or allowed lateness."""


def commerce_changes(settings: Settings, changelog: DataFrame) -> DataFrame:
    """The changelog's rows as event time reads them (its stream, or its versions read
    again): each order's and payment's first insert or snapshot row."""
    return (changelog.where(F.col("table").isin(COMMERCE) & F.col("_op").isin("c", "r"))
            .where(at_or_after(start_offsets(settings), "_topic", "_partition", "_offset"))
            .select(F.lit(COMMERCE_STREAM).alias("stream"), "table", "key", "after", *POSITION))


class EventTimeBatch(Batch):
    """The steps of the projection's docstring, in order."""

    def __init__(self, settings: Settings, fence: Fence):
        super().__init__(NAME, settings, fence)
        self.delay = timedelta(seconds=settings.watermark_delay_seconds)
        self.lateness = timedelta(seconds=settings.allowed_lateness_seconds)
        self.clocks: dict[str, eventtime.Clock] = {}             # read from `inputs` by `open`
        self.customers: dict[int, int | None] = {}               # account -> customer (never changes)
        self.early_ends: dict[str, datetime | None] = {}         # per view: its early rows' earliest end (`_passed`)

    # -- step 0: the tables, the settings they were built with, the clocks --
    def open(self, spark: SparkSession) -> None:
        self.spark = spark
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

    def apply(self, batch: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome | None:
        spark = self.spark = commit.spark
        # Step 1: read and parse.
        # The changelog's rows through a place where the views stand too if it can, and
        # the postings from the ledger as of a point there, not from its stream
        # (projections/derived.py), so that the tables stand at a place.
        read = derived.reading(spark, self.settings, NAME, commit.batch_id, mirrors=[], follows=(VIEWS_PROJECTION,))
        commerce = batch.where(F.col("stream") == COMMERCE_STREAM)
        if read is None:
            rows = batch.collect()
        else:
            commerce = derived.changes(spark, self.settings, read, commerce,
                                       lambda changelog: commerce_changes(self.settings, changelog))
            rows = commerce.collect() + derived.entries(spark, read).select(
                F.lit(LEDGER).alias("stream"), *POSTING, *POSITION).collect()
        if not rows:  # a metadata-only version of an input (a fencing stamp): nothing to do
            derived.publish(self.settings, NAME, commit.batch_id, read, targets(self.settings), self.fence)
            # (the tables stand where those versions are too)
            return Outcome(applied={}, stopped_short=True) if read and read.holds else None
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
                    errors.append(DeadLetter(r["_topic"], r["_partition"], r["_offset"], r["table"], str(error)))
                    continue
            event["position"] = position_of(r)
            events.append(event)
        dead = self._dead_letters(commit, commerce, errors)
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
        applied = {INPUTS.table: self._append_inputs(commit, stamped)}
        self.clocks = clocks
        steps.done("stamp")
        # Steps 5 and 6: the views of the streams this batch moved, then the late events.
        batch_events = [*known.values(), *stamped]
        late = []
        postings = [e for e in batch_events if e["stream"] == LEDGER]
        if postings:
            wm = self.clocks[LEDGER].watermark(self.delay)
            stored = self._stored_postings(postings)
            for view, windows_of in WINDOWED:
                applied[view.table], found = self._windows(commit, view, windows_of, postings, stored, wm)
                late += found
                steps.done(view.table)
            applied[SESSIONS.table], found = self._sessions(commit, postings, stored, wm)
            late += found
            steps.done(SESSIONS.table)
        commerce = [e for e in batch_events if e["stream"] == COMMERCE_STREAM]
        if commerce:
            applied[ORDERS.table], found = self._orders(commit, commerce,
                                                        self.clocks[COMMERCE_STREAM].watermark(self.delay))
            late += found
            steps.done(ORDERS.table)
        applied[LATE.table] = self._insert_late(commit, late)
        # The late events held, counted (not summed per batch: a batch replayed after a
        # crash between its commit and this record inserts nothing, and counts right).
        held = {STATE_KEY[LATE.table]: self._read(LATE).count()} if late else {}
        steps.done(LATE.table)
        derived.publish(self.settings, NAME, commit.batch_id, read, targets(self.settings), self.fence)
        return Outcome(applied={STATE_KEY[t]: n for t, n in applied.items()},
                       dead_letters={STATE_KEY[INPUTS.table]: dead} if dead else {}, late_events=held,
                       watermarks={s: c.watermark(self.delay).isoformat() + "Z" for s, c in self.clocks.items()},
                       stopped_short=bool(read and read.holds))

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
        for r in self._read(INPUTS).where(one_of("event_id", [e["event_id"] for e in maybe])).collect():
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

    def _dead_letters(self, commit: BatchCommit, commerce: DataFrame, errors: list[DeadLetter]) -> int:
        if not errors:
            return 0
        records = commerce.select(
            F.col("key").cast("binary").alias("key"), F.col("after").cast("binary").alias("value"),
            F.col("_topic").alias("topic"), F.col("_partition").alias("partition"),
            F.col("_offset").alias("offset"))
        return deadletters.write(commit, self.settings, records, errors)

    def _append_inputs(self, commit: BatchCommit, stamped: list[dict]) -> int:
        if not stamped:
            return 0
        frame = self._frame(commit.spark, INPUTS, stamped)
        commit.append(frame, path(self.settings, INPUTS.table), INPUTS.table)
        return len(stamped)

    def _merge(self, commit: BatchCommit, view: View, rows: list[dict], watermark: datetime,
               gone: list[tuple] = (), swept: dict[str, str] | None = None) -> int:
        """One MERGE of the recomputed rows: update what differs, insert what is new, delete
        the stored rows whose keys are `gone` (sessions a bridging posting merged), and
        sweep: stored early rows whose end the watermark has passed become final (a window
        is closed by time passing, not by an event in it). Every row it changes is in its
        source, and its condition bounds the stored rows' keys to those (`_within`), so Delta
        reads only the files that can hold them: no clause for stored rows the source does
        not match (whenNotMatchedBySource), which would make it join every file whole."""
        spark = commit.spark
        merged = {tuple(r[k] for k in view.keys) for r in rows}
        finals = [key for key in self._passed(view, watermark) if key not in merged and key not in gone]
        # (`_passed` has set this view's entry; the batch's own early rows may lower it.)
        self.early_ends[view.table] = min(filter(None, [self.early_ends[view.table], *(
            r[view.end] for r in rows if r["emission"] == eventtime.EARLY)]), default=None)
        if not (rows or gone or finals):
            return 0
        now = datetime.now(timezone.utc)
        records = [tuple(r.get(c) for c in view.columns) + (now, action) for action, keyed in (
            (UPSERT, rows), (DELETE, [dict(zip(view.keys, key)) for key in gone]),
            (SWEEP, [dict(zip(view.keys, key)) for key in finals])) for r in keyed]
        source = spark.createDataFrame(records, f"{view.schema}, _action string")
        on = " AND ".join([f"t.{k} = s.{k}" for k in view.keys] + _within(view, [*merged, *gone, *finals]))
        compared = [c for c in view.columns if c not in view.keys]
        differs = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in compared)
        builder = (DeltaTable.forPath(spark, path(self.settings, view.table)).alias("t").merge(source.alias("s"), on)
                   .whenMatchedDelete(condition=f"s._action = '{DELETE}'")
                   .whenMatchedUpdate(condition=f"s._action = '{SWEEP}' AND t.emission = '{eventtime.EARLY}'",
                                      set={"emission": f"'{eventtime.FINAL}'", "_applied_at": "s._applied_at",
                                           **(swept or {})})
                   .whenMatchedUpdate(condition=f"s._action = '{UPSERT}' AND ({differs})",
                                      set={c: f"s.{c}" for c in [*compared, "_applied_at"]})
                   .whenNotMatchedInsert(condition=f"s._action = '{UPSERT}'",
                                         values={c: f"s.{c}" for c in [*view.columns, "_applied_at"]}))
        metrics = commit.merge(builder, path(self.settings, view.table), view.table)
        return int(metrics.get("num_affected_rows", 0))

    def _passed(self, view: View, watermark: datetime) -> list[tuple]:
        """The keys of the stored early rows whose end `watermark` has passed, read only
        once it has reached the earliest end of an early row (`early_ends`, unknown until
        the first read of a run; Delta's file statistics on `emission` skip the files whose
        rows are all final or corrections). Leaves `early_ends` at the earliest end of the
        early rows it does not return."""
        if view.table in self.early_ends and (self.early_ends[view.table] is None
                                              or self.early_ends[view.table] > watermark):
            return []
        early = self._read(view).where(F.col("emission") == eventtime.EARLY).select(*view.keys, view.end).collect()
        ends = [(tuple(r[k] for k in view.keys), r[view.end]) for r in early if r[view.end] is not None]
        self.early_ends[view.table] = min((end for _, end in ends if end > watermark), default=None)
        return [key for key, end in ends if end <= watermark]

    def _stored_postings(self, postings: list[dict]) -> list[dict]:
        """The stored postings step 5's three views recompute from, in one read of
        `inputs` (a read per view cost a file listing and a scan each): those of the
        batch's accounts in the time span of any window its postings fall in (the
        windowed views), and every posting of its customers (the sessions)."""
        accounts = sorted({e["account"] for e in postings})
        spans = [_window_span(postings, windows_of) for _, windows_of in WINDOWED]
        low, high = min(low for low, _ in spans), max(high for _, high in spans)
        wanted = (one_of("account", accounts) & (F.col("event_time") >= F.lit(low))
                  & (F.col("event_time") < F.lit(high)))
        customers = _customers(postings)
        if customers:
            wanted = wanted | one_of("customer_id", customers)
        return [r.asDict() for r in self._read(INPUTS).where((F.col("stream") == LEDGER) & wanted).collect()]

    def _windows(self, commit: BatchCommit, view: View, windows_of, postings: list[dict], stored: list[dict],
                 watermark: datetime):
        """Step 5 for a windowed view: the windows the batch's postings fall in,
        recomputed from every `stored` posting of their accounts in their time range."""
        wanted = {(e["account"], start) for e in postings for start, _ in windows_of(e["event_time"])}
        accounts = {account for account, _ in wanted}
        low, high = _window_span(postings, windows_of)
        entries = (dict(r) for r in stored
                   if r["account"] in accounts and r["event_time"] is not None and low <= r["event_time"] < high)
        rows, late = eventtime.window_rows(entries, windows_of, watermark, self.lateness)
        rows = [row for key, row in rows.items() if key in wanted]
        return self._merge(commit, view, rows, watermark), [dict(r, view=view.table) for r in late]

    def _sessions(self, commit: BatchCommit, postings: list[dict], stored: list[dict], watermark: datetime):
        """Step 5 for sessions: every session of the customers the batch's postings
        belong to, recomputed from their `stored` postings; a stored session a bridging
        posting merged is deleted."""
        customers = _customers(postings)
        rows, late = [], []
        by_customer: dict[int, list[dict]] = {}
        for r in stored:
            if r["customer_id"] in customers:
                entry = dict(r)
                entry["position"] = position_of(entry)
                by_customer.setdefault(entry["customer_id"], []).append(entry)
        for entries in by_customer.values():
            found, gone = eventtime.session_rows(entries, eventtime.SESSION_GAP, watermark, self.lateness)
            rows += found
            late += [dict(r, view=SESSIONS.table) for r in gone]
        kept = {tuple(r[k] for k in SESSIONS.keys) for r in rows}
        stored = (self._read(SESSIONS).where(one_of("customer_id", customers)).select(*SESSIONS.keys).collect()
                  if customers else [])
        gone = sorted(tuple(r) for r in stored if tuple(r) not in kept)  # merged into another by a bridging posting
        return self._merge(commit, SESSIONS, rows, watermark, gone=gone), late

    def _orders(self, commit: BatchCommit, events: list[dict], watermark: datetime):
        """Step 5 for the join: the orders of the batch's orders and payments, each
        recomputed from its stored order and payment events."""
        order_ids = sorted({e["order_id"] for e in events})
        stored: dict[int, dict] = {}
        payments: dict[int, list[dict]] = {}
        for r in self._read(INPUTS).where((F.col("stream") == COMMERCE_STREAM)
                                          & one_of("order_id", order_ids)).collect():
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
        return self._merge(commit, ORDERS, rows, watermark, swept=swept), late

    def _insert_late(self, commit: BatchCommit, late: list[dict]) -> int:
        """Step 6: insert-only, so a late pair found again (a replay, a recompute) stays
        one row; returns how many were new."""
        if not late:
            return 0
        spark = commit.spark
        source = self._frame(spark, LATE, late)
        on = " AND ".join(f"t.{k} = s.{k}" for k in LATE.keys)
        builder = (DeltaTable.forPath(spark, path(self.settings, LATE.table)).alias("t")
                   .merge(source.alias("s"), on).whenNotMatchedInsertAll())
        metrics = commit.merge(builder, path(self.settings, LATE.table), LATE.table)
        return int(metrics.get("num_inserted_rows", 0))

