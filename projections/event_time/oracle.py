"""Event time's oracle, "streaming equals batch": every table recomputed in Spark batch
over the ledger and the changelog at rest, written apart from the streaming path."""

from __future__ import annotations

from datetime import timedelta

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from projections.changelog import changelog_path
from projections.event_time import rules as eventtime
from projections.event_time.tables import (COMMERCE, COMMERCE_STREAM, HOURLY, INPUTS, LATE, LEDGER, MISSING, ORDERS,
                                           POSITION, SESSIONS, SLIDING, VIEWS, View, path, position_of, source)
from projections.ledger import ledger_path
from sync.compare import Report, compare
from sync.config import Settings
from sync.delta.reader import Readers
from sync.projection import Target
from sync.streaming.stream import at_or_after, start_offsets


def check(settings: Settings, readers: Readers, target: Target) -> Report:
    """Streaming equals batch: the table `target` names against its recomputation (made
    once per verify, for every table's check: `Expected`)."""
    spark = readers.spark
    view = next(v for v in VIEWS if v.target == target.name)
    types = {"bigint": "bigint", "int": "integer", "string": "text", "timestamp": "timestamp without time zone"}
    kinds = [c.split()[1] for c in view.schema.split(", ") if not c.startswith("`_applied_at`")]
    columns = [types.get(k, "numeric") for k in kinds]
    table = path(settings, view.table)
    expected = (readers.shared("event_time.expected", lambda: Expected(settings, spark)).rows(view)
                if source(settings).exist() else [])
    actual = ((tuple(r) for r in spark.read.format("delta").load(table).select(*view.columns).toLocalIterator())
              if DeltaTable.isDeltaTable(spark, table) else [])
    return compare(target, expected, actual, view.columns, columns, view.keys)


def _spark(duration: timedelta) -> str:
    """A duration as Spark's window functions and INTERVAL literals take it."""
    return f"{int(duration.total_seconds())} seconds"


HOURLY_SHAPE = (_spark(eventtime.HOURLY),)
SLIDING_SHAPE = (_spark(eventtime.SLIDE_SIZE), _spark(eventtime.SLIDE_STEP))


class Expected:
    """The batch definitions, written apart from the streaming path (batch.py, rules.py):
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

