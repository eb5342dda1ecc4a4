"""What event time stores: its tables' schemas, keys and paths, and how an input row
becomes an event (the streaming batch, batch.py, and the oracle, oracle.py, share it)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation

from projections.changelog import changelog_path
from projections.ledger import ledger_path
from sync.config import Settings
from sync.delta import catalog
from sync.projection import DeltaTables, Target, state_key

NAME = "event_time"
KIND = "event time"
COMMERCE = ["public.orders", "public.payments"]
LEDGER, COMMERCE_STREAM = "ledger", "commerce"
POSITION = ["_commit_lsn", "_lsn", "_topic", "_partition", "_offset"]
POSTING = ["event_id", "account", "amount", "currency", "event_time"]  # a ledger entry's columns read
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
# What the progress records each table's figures under, for `status`.
STATE_KEY = {v.table: state_key(v.target) for v in VIEWS}
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



def path(settings: Settings, table: str) -> str:
    return str(catalog.root(settings, NAME) / "event_time" / table)



def targets(settings: Settings) -> list[Target]:
    sources = {"inputs": "ledger, changelog", "order_payments": "orders, payments"}
    return [Target(name=v.target, kind=v.kind, table=path(settings, v.table), keys=v.keys,
                   source=sources.get(v.table, "event_time.inputs")) for v in VIEWS]


def source(settings: Settings) -> DeltaTables:
    """The changelog and the ledger, in the order of the query's sources."""
    return DeltaTables((changelog_path(settings), ledger_path(settings)))


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

