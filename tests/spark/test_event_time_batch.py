"""The event-time batch function on real Spark and Delta, with controlled event times.

Each test hands EventTimeBatch the rows its two Delta streams would give it (ledger
postings and the changelog's order and payment rows), one list per micro-batch, so
out-of-order arrival, stragglers, late events, session merges, replays and batch
boundaries are tested on exact inputs. The whole path from Postgres is in tests/e2e.
"""

import dataclasses
import json
import random
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from projections.changelog import SCHEMA as CHANGELOG_SCHEMA
from projections.changelog import changelog_path
from projections.event_time import oracle
from projections.event_time import tables as event_time
from projections.event_time.batch import EventTimeBatch
from projections.event_time.projection import PROJECTION as EVENT_TIME
from sync import config
from sync.delta import fencing, reader
from sync.streaming import progress

pytestmark = pytest.mark.spark

T = datetime(2026, 11, 24, 10, 0)   # "10:00" below
RECORD = ("stream string, `table` string, key string, after string, event_id string, account bigint, "
          "amount decimal(20,4), currency string, event_time timestamp, `_commit_lsn` bigint, `_lsn` bigint, "
          "`_topic` string, `_partition` int, `_offset` bigint")
ACCOUNT, OTHER, CUSTOMER = 11, 12, 7


def at(hhmm: str) -> datetime:
    hours, minutes = map(int, hhmm.split(":"))
    return T.replace(hour=hours, minute=minutes)


class Log:
    """Events in commit order: each gets the next position."""

    def __init__(self):
        self.n = 0

    def _position(self, topic):
        self.n += 1
        return (self.n * 10, self.n * 10 + 1, topic, 0, self.n)

    def posting(self, when, amount="10.00", account=ACCOUNT):
        return ("ledger", None, None, None, f"posting-{self.n + 1}", account, Decimal(amount), "EUR", when,
                *self._position("lakesync.events.account"))

    def order(self, order_id, when):
        after = json.dumps({"id": order_id, "placed_at": when.isoformat() + "Z", "status": "placed"})
        return ("commerce", "public.orders", json.dumps({"id": order_id}), after, None, None, None, None, None,
                *self._position("lakesync.public.orders"))

    def payment(self, payment_id, order_id, when, amount="25.50"):
        after = json.dumps({"id": payment_id, "order_id": order_id, "amount": amount,
                            "paid_at": when.isoformat() + "Z"})
        return ("commerce", "public.payments", json.dumps({"id": payment_id}), after, None, None, None, None, None,
                *self._position("lakesync.public.payments"))


@pytest.fixture
def settings(tmp_path, spark):
    # The batches are handed their rows as the streams would (postings too: with whole
    # source transactions the runner reads those from the ledger at its points instead,
    # projections/derived.py, which tests/e2e covers).
    settings = dataclasses.replace(config.load(), lake=tmp_path / "lake", watermark_delay_seconds=600,
                                   allowed_lateness_seconds=3600, whole_transactions=False)
    accounts = [("public.accounts", "c", json.dumps({"id": a}), None, json.dumps({"id": a, "customer_id": c}),
                 1, 1, 1, None, "lakesync.public.accounts", 0, i, None, None)
                for i, (a, c) in enumerate([(ACCOUNT, CUSTOMER), (OTHER, CUSTOMER), (-1, None)])]
    spark.createDataFrame(accounts, CHANGELOG_SCHEMA).write.format("delta").save(changelog_path(settings))
    return settings


def new_run(spark, settings):
    return EventTimeBatch(settings, fencing.take(spark, settings, event_time.NAME, []))


def run(spark, settings, batches, first_id=0, runner=None):
    runner = runner or new_run(spark, settings)
    for n, rows in enumerate(batches):
        runner(spark.createDataFrame(rows, RECORD), first_id + n)
    return runner


def table(spark, settings, view, where="true"):
    rows = spark.read.format("delta").load(event_time.path(settings, view.table)).where(where)
    return sorted((r.asDict() for r in rows.drop("_applied_at").collect()), key=lambda r: json.dumps(r, default=str))


def hourly(spark, settings, start="10:00", account=ACCOUNT):
    rows = table(spark, settings, event_time.HOURLY, f"account = {account} AND window_start = '{at(start)}'")
    return rows[0] if rows else None


def test_windows_go_early_final_correction_and_a_straggler_beyond_lateness_is_kept_as_late(spark, settings):
    log = Log()
    runner = run(spark, settings, [[log.posting(at("10:05"))], [log.posting(at("10:50"))],
                                   [log.posting(at("10:20"), "-2.50")]])
    row = hourly(spark, settings)
    # Out of order, all before the watermark passes 11:00: early rows, counted.
    assert (row["entries"], row["net_amount"], row["emission"]) == (3, Decimal("17.5000"), "early")
    # 11:30 moves the watermark to 11:20: the 10:00 window is final without an event in it.
    run(spark, settings, [[log.posting(at("11:30"))]], 3, runner)
    assert hourly(spark, settings)["emission"] == "final"
    # A straggler at 10:55 (watermark 11:20 < 11:00 + 1 h): it corrects the window.
    run(spark, settings, [[log.posting(at("10:55"), "1.25")]], 4, runner)
    row = hourly(spark, settings)
    assert (row["entries"], row["net_amount"], row["corrections"], row["emission"]) == \
        (4, Decimal("18.7500"), 1, "correction")
    # 14:00, then a straggler at 10:40 (watermark 13:50 >= 12:00): late for its hourly
    # window, both sliding windows and its session; the window stays as it was.
    run(spark, settings, [[log.posting(at("14:00"))], [log.posting(at("10:40"), "99")]], 5, runner)
    assert hourly(spark, settings) == row
    late = table(spark, settings, event_time.LATE, f"event_id = 'posting-{log.n}'")
    assert sorted((r["view"], r["window_start"]) for r in late) == [
        ("account_hourly", at("10:00")), ("account_sliding", at("10:35")), ("account_sliding", at("10:40")),
        ("customer_sessions", at("10:40"))]
    state = progress.read(settings, event_time.NAME)
    assert state["tables"]["event_time"]["late_events"] == 4
    assert state["watermarks"]["ledger"] == "2026-11-24T13:50:00Z"
    sliding = table(spark, settings, event_time.SLIDING, f"account = {ACCOUNT} AND window_start = '{at('10:50')}'")
    assert [(r["entries"], r["corrections"], r["emission"]) for r in sliding] == [(2, 1, "correction")]


def test_a_bridging_posting_merges_two_sessions(spark, settings):
    log = Log()
    runner = run(spark, settings, [[log.posting(at("11:40"))], [log.posting(at("12:25"), account=OTHER)]])
    sessions = table(spark, settings, event_time.SESSIONS)
    assert [(r["session_start"], r["session_end"], r["emission"]) for r in sessions] == [
        (at("11:40"), at("12:10"), "final"), (at("12:25"), at("12:55"), "early")]
    run(spark, settings, [[log.posting(at("12:00"))]], 2, runner)
    sessions = table(spark, settings, event_time.SESSIONS)
    assert [(r["customer_id"], r["session_start"], r["session_end"], r["entries"], r["corrections"], r["emission"])
            for r in sessions] == [(CUSTOMER, at("11:40"), at("12:55"), 3, 1, "early")]
    # The house account has no customer: it is in the windows, not in the sessions.
    run(spark, settings, [[log.posting(at("12:01"), account=-1)]], 3, runner)
    assert len(table(spark, settings, event_time.SESSIONS)) == 1
    assert hourly(spark, settings, "12:00", account=-1)["entries"] == 1


def test_an_order_goes_pending_unpaid_then_paid_and_a_payment_beyond_lateness_is_late(spark, settings):
    log = Log()
    runner = run(spark, settings, [[log.order(1, at("12:20")), log.order(2, at("12:20")), log.order(5, at("12:20"))],
                                   [log.payment(20, 2, at("12:50"))]])
    orders = {r["order_id"]: r for r in table(spark, settings, event_time.ORDERS)}
    assert [orders[o]["payment_status"] for o in (1, 2, 5)] == ["pending", "paid", "pending"]
    assert orders[2]["time_to_pay_us"] == 30 * 60 * 1_000_000 and orders[2]["amount"] == Decimal("25.50")
    # An order at 13:40 moves the commerce watermark to 13:30, past 13:20.
    run(spark, settings, [[log.order(4, at("13:40"))]], 2, runner)
    orders = {r["order_id"]: r for r in table(spark, settings, event_time.ORDERS)}
    assert [(orders[o]["payment_status"], orders[o]["emission"]) for o in (1, 2, 5)] == [
        ("unpaid", "final"), ("paid", "final"), ("unpaid", "final")]
    # Order 1's payment (12:55) arrives within the allowed lateness: paid, a correction.
    run(spark, settings, [[log.payment(10, 1, at("12:55"), "7.05")]], 3, runner)
    order = {r["order_id"]: r for r in table(spark, settings, event_time.ORDERS)}[1]
    assert (order["payment_status"], order["payment_id"], order["corrections"], order["emission"]) == \
        ("paid", 10, 1, "correction")
    # After 14:40 (watermark 14:30 >= 13:20 + 1 h), order 5's payment is late.
    run(spark, settings, [[log.order(6, at("14:40"))], [log.payment(50, 5, at("12:30"))]], 4, runner)
    assert {r["order_id"]: r for r in table(spark, settings, event_time.ORDERS)}[5]["payment_status"] == "unpaid"
    assert [(r["view"], r["event_id"], r["key"]) for r in table(spark, settings, event_time.LATE)] == [
        ("order_payments", "payment:50", "5")]


def scenario():
    """One mixed history in commit order: postings and orders, out of order and late."""
    log = Log()
    times = ["10:05", "10:50", "10:20", "11:30", "10:55", "11:40", "12:25", "12:00", "14:00", "10:40", "16:00"]
    events = [log.posting(at(t), f"{n + 1}.0001", account=[ACCOUNT, OTHER, -1][n % 3]) for n, t in enumerate(times)]
    events += [log.order(1, at("12:20")), log.order(2, at("12:20")), log.payment(20, 2, at("12:50"), "0.01"),
               log.order(4, at("13:40")), log.payment(10, 1, at("12:55")), log.order(6, at("14:40")),
               log.payment(11, 1, at("12:21")), log.order(7, T + timedelta(hours=8, microseconds=1))]
    return events


def write_sources(spark, settings, events):
    """The ledger and the changelog holding `events`, for the oracle's recomputation at rest."""
    from projections.ledger import projection as ledger

    names = RECORD.replace("`", "").split(", ")
    rows = [dict(zip([n.split()[0] for n in names], e)) for e in events]
    wanted = spark.createDataFrame([], ledger.SCHEMA).columns
    postings = [tuple(r.get(c) for c in wanted) for r in rows if r["stream"] == "ledger"]
    spark.createDataFrame(postings, ledger.SCHEMA).write.format("delta").save(ledger.ledger_path(settings))
    wanted = spark.createDataFrame([], CHANGELOG_SCHEMA).columns
    changes = [tuple({**r, "_op": "c"}.get(c) for c in wanted) for r in rows if r["stream"] == "commerce"]
    spark.createDataFrame(changes, CHANGELOG_SCHEMA).write.format("delta").mode("append").save(
        changelog_path(settings))


def contents(spark, settings):
    return {view.table: table(spark, settings, view) for view in event_time.VIEWS}


def test_any_batch_boundaries_give_the_same_tables_and_check_agrees(spark, settings, tmp_path):
    events = scenario()
    write_sources(spark, settings, events)
    run(spark, settings, [events])
    whole = contents(spark, settings)
    assert len(whole["inputs"]) == len(events) and whole["late_events"]
    readers = reader.Readers(lambda: spark, spark)  # one recomputation for every table's check, as in verify
    for target in EVENT_TIME.targets(settings):
        report = oracle.check(settings, readers, target)
        assert report.differences == 0, json.dumps([target.name, report.sample], indent=1, default=str)
        assert report.source_rows > 0
    rng = random.Random(8)
    cuts = sorted(rng.sample(range(1, len(events)), 5))
    split = [events[low:high] for low, high in zip([0, *cuts], [*cuts, len(events)])]
    other = dataclasses.replace(settings, lake=tmp_path / "other")
    spark.read.format("delta").load(changelog_path(settings)).write.format("delta").save(changelog_path(other))
    runner = run(spark, other, split)
    assert contents(spark, other) == whole
    # A replayed batch, in this run and in a new one, changes nothing and counts no late event twice.
    late = progress.read(other, event_time.NAME)["tables"]["event_time"]["late_events"]
    assert late == len(whole["late_events"])
    run(spark, other, [split[-1]], len(split) - 1, runner)
    run(spark, other, [split[-1]], len(split) - 1)
    assert contents(spark, other) == whole
    assert progress.read(other, event_time.NAME)["tables"]["event_time"]["late_events"] == late


def test_money_stays_decimal_and_times_keep_microseconds(spark, settings):
    log = Log()
    first = T + timedelta(microseconds=1)
    run(spark, settings, [[log.posting(first, "0.0001"), log.posting(first, "9999999999999999.9999"),
                           log.order(3, first), log.payment(30, 3, first + timedelta(microseconds=1), "0.01")]])
    row = hourly(spark, settings)
    assert row["net_amount"] == Decimal("10000000000000000.0000") and isinstance(row["volume"], Decimal)
    order = table(spark, settings, event_time.ORDERS)[0]
    assert (order["placed_at"], order["time_to_pay_us"], order["amount"]) == (first, 1, Decimal("0.01"))
