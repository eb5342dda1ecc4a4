"""Event time on the whole stack: windows, the watermark, late data and the interval join.

The bank and the shop write with controlled event times (`occurred_at`, `placed_at`,
`paid_at`) two days ahead, one transaction per step, so the arrival order is the commit
order below. After three of the steps the barrier (`lakesync wait`) is passed and the window
row read, so the test sees each emission the watermark gives: early, final (by time
passing: the event that moved the watermark is in another window), correction; and at
the end, a straggler beyond the allowed lateness kept in late_events.

This test runs last (tests/e2e/conftest.py): its event times move the shared stack's
watermarks two days ahead, after which every posting the other tests make would be late.

Oracles: every event-time table equals its batch recomputation at rest (`synced`, which
runs `event_time.check`); the join also equals Postgres' own SQL (ORDER_PAYMENTS_SQL),
except the one payment this test makes arrive beyond the allowed lateness.
"""

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from projections.event_time import tables as event_time
from sync import config
from sync.demo import bank
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e

KEYS = range(662000, 662100)    # keys no other test uses
A, B, E = 662001, 662002, 662003    # accounts (and their customers)
BASE = (datetime.now(timezone.utc) + timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
TABLES = ("event_time.inputs", "window.account_hourly", "window.account_sliding", "window.customer_sessions",
          "join.order_payments", "late.event_time")


def at(hhmm: str) -> datetime:
    """BASE is written 10:00 below."""
    hours, minutes = map(int, hhmm.split(":"))
    return BASE + timedelta(hours=hours - 10, minutes=minutes)


def show(t: datetime | None) -> str:
    if t is None:
        return "-"
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t
    delta = t - BASE
    hours, rest = divmod(int(delta.total_seconds()), 3600)
    return f"{10 + hours:02d}:{rest // 60:02d}"


class Shop:
    """One transaction per call, through the application's own code (sync/demo/bank.py)."""

    def __init__(self, engine):
        self.engine = engine

    def tx(self, work):
        with Session(self.engine) as session, session.begin():
            return work(session)

    def sql(self, statement, **params):
        self.tx(lambda s: s.execute(text(statement), params))


@pytest.fixture(scope="module")
def shop(stack):
    engine = bank.engine(config.role_dsn(stack, config.ROLES["app"]))
    shop = Shop(engine)

    def open_accounts(session):
        bank.open_house_accounts(session)
        for n in (A, B, E):
            session.execute(text("INSERT INTO customers (id, name, email) VALUES (:id, :name, :email)"),
                            {"id": n, "name": f"Event time {n}", "email": f"et{n}@x"})
            session.execute(text("INSERT INTO accounts (id, customer_id, currency) VALUES (:id, :id, 'EUR')"),
                            {"id": n})
    shop.tx(open_accounts)
    yield shop
    engine.dispose()


def spark_rows(spark, stack, view, where):
    frame = spark.read.format("delta").load(event_time.path(stack, view.table)).where(where)
    return [r.asDict() for r in frame.drop("_applied_at").collect()]


def test_windows_watermarks_late_data_and_the_payment_join(stack, shop, spark, synced, db):
    example = []   # the worked example in docs/views-and-event-time.md (logs/event_time_example.txt)

    def hourly_row(note, event):
        lakesync("wait", "--timeout", "600", timeout=660, check=True)
        window = f"account = {A} AND window_start = '{at('10:00'):%Y-%m-%d %H:%M:%S}'"
        row = spark_rows(spark, stack, event_time.HOURLY, window)[0]
        stamp = spark_rows(spark, stack, event_time.INPUTS,
                           f"account = {A} AND event_time = '{event:%Y-%m-%d %H:%M:%S}'")
        example.append(f"{note:<34} event {show(event)}  watermark_before {show(stamp[0]['watermark_before'])}"
                       f"  | 10:00-11:00: entries {row['entries']}, net {row['net_amount']}, "
                       f"corrections {row['corrections']}, {row['emission']}")
        return row

    # 1. Account A's hourly window 10:00-11:00: out of order, final by the sweep, a correction.
    # (The barrier after three of the steps only, each costs a batch of every Delta-fed query.)
    shop.tx(lambda s: bank.deposit(s, A, Decimal("100.0000"), occurred_at=at("10:05")))
    shop.tx(lambda s: bank.transfer(s, A, B, Decimal("10.0000"), occurred_at=at("10:50")))
    shop.tx(lambda s: bank.transfer(s, A, B, Decimal("5.0000"), occurred_at=at("10:20")))
    emissions = [hourly_row("transfer 5 A->B (out of order)", at("10:20"))["emission"]]
    shop.tx(lambda s: bank.transfer(s, A, B, Decimal("1.0000"), occurred_at=at("11:30")))
    emissions.append(hourly_row("transfer 1 A->B", at("11:30"))["emission"])
    shop.tx(lambda s: bank.transfer(s, A, B, Decimal("2.0000"), occurred_at=at("10:55")))
    row = hourly_row("transfer 2 A->B (straggler)", at("10:55"))
    emissions.append(row["emission"])
    assert emissions == ["early", "final", "correction"], example
    assert (row["entries"], row["net_amount"], row["corrections"]) == (4, Decimal("83.0000"), 1)

    # 2. Customer E's sessions: two, then one when a posting bridges them.
    for when in ("11:40", "12:25", "12:00"):
        shop.tx(lambda s, when=when: bank.deposit(s, E, Decimal("1.0000"), occurred_at=at(when)))

    # 3. Orders and their payments, on the commerce clock.
    for order in (1, 2, 3, 5):
        shop.sql("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (:id, :c, 'placed', :at)",
                 id=KEYS[order], c=E, at=at("12:20"))
    pay = "INSERT INTO payments (id, order_id, amount, paid_at) VALUES (:id, :order, :amount, :at)"
    shop.sql(pay, id=KEYS[2], order=KEYS[2], amount=Decimal("19.99"), at=at("12:50"))
    shop.sql("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (:id, :c, 'placed', :at)",
             id=KEYS[4], c=E, at=at("13:40"))
    shop.sql(pay, id=KEYS[3], order=KEYS[3], amount=Decimal("5.00"), at=at("12:55"))
    shop.sql("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (:id, :c, 'placed', :at)",
             id=KEYS[6], c=E, at=at("14:40"))
    shop.sql(pay, id=KEYS[5], order=KEYS[5], amount=Decimal("7.50"), at=at("12:30"))

    # 4. Beyond the allowed lateness: after 14:00 (watermark 13:50), a transfer dated 10:40.
    shop.tx(lambda s: bank.deposit(s, E, Decimal("1.0000"), occurred_at=at("14:00")))
    shop.tx(lambda s: bank.transfer(s, A, B, Decimal("3.0000"), occurred_at=at("10:40")))

    # 5. Closing events six hours on: every window above is past its end.
    shop.tx(lambda s: bank.deposit(s, E, Decimal("1.0000"), occurred_at=at("16:00")))
    shop.sql("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (:id, :c, 'placed', :at)",
             id=KEYS[9], c=E, at=at("16:00"))

    reports = synced(*TABLES)
    row = hourly_row("transfer 3 A->B (beyond lateness)", at("10:40"))
    assert (row["entries"], row["net_amount"], row["emission"]) == (4, Decimal("83.0000"), "correction")
    assert all(reports[name].source_rows > 0 for name in TABLES), {n: r.source_rows for n, r in reports.items()}

    sessions = spark_rows(spark, stack, event_time.SESSIONS, f"customer_id = {E}")
    bridged = [r for r in sessions if r["session_start"] == at("11:40").replace(tzinfo=None)]
    assert [(show(r["session_end"]), r["entries"], r["corrections"], r["emission"]) for r in bridged] == \
        [("12:55", 3, 1, "correction")], sessions
    assert len(sessions) == 3  # and 14:00, 16:00

    orders = {r["order_id"] - KEYS[0]: r for r in spark_rows(spark, stack, event_time.ORDERS,
                                                             f"order_id BETWEEN {KEYS[0]} AND {KEYS[-1]}")}
    assert {o: (r["payment_status"], r["emission"]) for o, r in orders.items()} == {
        1: ("unpaid", "final"), 2: ("paid", "final"), 3: ("paid", "correction"), 4: ("unpaid", "final"),
        5: ("unpaid", "final"), 6: ("unpaid", "final"), 9: ("pending", "early")}
    assert orders[2]["time_to_pay_us"] == 30 * 60 * 1_000_000 and orders[2]["amount"] == Decimal("19.99")
    example.append(f"orders placed 12:20 (pay by 13:20), once the commerce watermark passed 13:20: "
                   f"order 1 {orders[1]['payment_status']}, {orders[1]['emission']}; order 3, whose payment "
                   f"dated 12:55 arrived after, {orders[3]['payment_status']}, {orders[3]['emission']} "
                   f"(corrections {orders[3]['corrections']}); order 5, whose payment dated 12:30 arrived "
                   f"beyond the lateness, {orders[5]['payment_status']}")

    # The join equals Postgres' SQL, but for the payment that arrived beyond the lateness.
    with db.cursor() as cursor:
        cursor.execute(event_time.ORDER_PAYMENTS_SQL + " WHERE o.id BETWEEN %s AND %s", (KEYS[0], KEYS[-1]))
        names = [c.name for c in cursor.description]
        postgres = {r[0] - KEYS[0]: dict(zip(names, r)) for r in cursor.fetchall()}
    utc = lambda t: t.astimezone(timezone.utc).replace(tzinfo=None) if t is not None else None  # noqa: E731
    differs = sorted(o for o, p in postgres.items() if orders[o]["emission"] != "early" and (
        (utc(p["placed_at"]), p["payment_id"], utc(p["paid_at"]), p["amount"], p["time_to_pay_us"],
         p["payment_status"]) != (orders[o]["placed_at"], orders[o]["payment_id"], orders[o]["paid_at"],
                                  orders[o]["amount"], orders[o]["time_to_pay_us"], orders[o]["payment_status"])))
    assert differs == [5], (differs, postgres, orders)

    # Late events: the 10:40 transfer's two postings, each late for its hourly window, both
    # sliding windows and its session; and order 5's payment. All counted in status.
    late = spark_rows(spark, stack, event_time.LATE, "true")
    ours = [r for r in late if r["key"] in (str(A), str(B), str(KEYS[5]))]
    assert sorted((r["view"], r["key"], show(r["window_start"])) for r in ours) == sorted(
        [(view, str(account), start) for account in (A, B)
         for view, start in (("account_hourly", "10:00"), ("account_sliding", "10:35"),
                             ("account_sliding", "10:40"), ("customer_sessions", "10:40"))]
        + [("order_payments", str(KEYS[5]), "12:20")]), ours
    status = json.loads(lakesync("status", "--json", check=True).stdout)
    counted = next(p for p in status["projections"] if p["name"] == "late.event_time")
    assert counted["late_events"] == len(late) and counted["watermarks"]["ledger"], counted
    example.append(f"late.event_time in `lakesync status --json`: late_events {counted['late_events']}, "
                   f"watermarks {counted['watermarks']}")
    (stack.logs / "event_time_example.txt").write_text("\n".join(example) + "\n")
