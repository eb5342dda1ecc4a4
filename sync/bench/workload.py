"""The benchmark's write load on the demo schema: inserts, updates and deletes with
hot-key skew, in Postgres, either flat out (a backlog of N change events) or at a fixed
rate of change events per second (for freshness).

Every statement reports the rows it changed, so the load knows how many change events
Debezium will emit: one per row inserted, updated or deleted (cascaded deletes are
avoided: lines are deleted explicitly, and counted). A delete also yields a tombstone
record in Kafka, which is not a change event.

Skew: keys are drawn from a Zipf-like law over the existing rows (`hot`), so a few
customers and recent orders take most updates, as in a shop.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from decimal import Decimal

import psycopg

from sync.demo import STATUSES, TIERS

CHUNK_EVENTS = 2_000   # change events per transaction when flat out
LINES_PER_ORDER = 3


@dataclass
class Counts:
    events: int = 0       # change events Debezium emits for what committed
    deletes: int = 0      # of which deletes (each also yields a tombstone record)
    transactions: int = 0

    def add(self, rows: int, deleted: bool = False) -> None:
        self.events += rows
        if deleted:
            self.deletes += rows


def hot(rng: random.Random, low: int, high: int, count: int, skew: float = 1.2) -> list[int]:
    """`count` distinct keys in [low, high], drawn with a Zipf-like bias to `high` (the
    newest rows are the hottest); fewer when the range is small."""
    size = high - low + 1
    if size <= 0:
        return []
    chosen: set[int] = set()
    for _ in range(count * 3):
        if len(chosen) >= min(count, size):
            break
        rank = int(rng.paretovariate(skew)) - 1  # 0, 0, 0, 1, 0, 2, ...: mostly small
        chosen.add(high - (rank % size))
    return sorted(chosen)


class Load:
    """Writes on one connection of the application role; the mix per transaction is
    about 45% inserts (orders and their lines), 40% updates (order status, customer
    tier, product price) and 15% deletes (old orders and their lines)."""

    def __init__(self, conn: psycopg.Connection, rng: random.Random):
        # In autocommit, each `transaction()` commits on its own; otherwise psycopg nests it
        # as a savepoint of one implicit transaction that would hold the whole load.
        conn.autocommit = True
        self.conn, self.rng = conn, rng
        self.counts = Counts()
        (self.max_order,) = conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()
        (self.min_order,) = conn.execute("SELECT coalesce(min(id), 1) FROM orders").fetchone()
        (self.customers,) = conn.execute("SELECT count(*) FROM customers").fetchone()
        (self.products,) = conn.execute("SELECT count(*) FROM products").fetchone()

    def transaction(self, events: int) -> int:
        """One transaction of about `events` change events; returns the events it made."""
        before = self.counts.events
        inserts = max(1, int(events * 0.45) // (1 + LINES_PER_ORDER))
        updates = max(1, int(events * 0.40))
        deletes = max(0, int(events * 0.15) // (1 + LINES_PER_ORDER))
        rng, conn = self.rng, self.conn
        with conn.transaction():
            first = self.max_order + 1
            self.max_order += inserts
            customers = [hot(rng, 1, self.customers, 1)[0] for _ in range(inserts)]
            self.counts.add(conn.execute(
                "INSERT INTO orders (id, customer_id, status) "
                "SELECT g, c, 'placed' FROM unnest(%s::bigint[], %s::bigint[]) AS t(g, c)",
                (list(range(first, self.max_order + 1)), customers)).rowcount)
            self.counts.add(conn.execute(
                "INSERT INTO order_items (order_id, line_no, product_id, qty, unit_price) "
                "SELECT o, l, p.id, 1 + (o * l) %% 5, p.price FROM generate_series(%s::bigint, %s::bigint) o "
                "CROSS JOIN generate_series(1, %s) l JOIN products p ON p.id = 1 + (o * 7 + l) %% %s",
                (first, self.max_order, LINES_PER_ORDER, self.products)).rowcount)
            orders = hot(rng, self.min_order, self.max_order, int(updates * 0.8))
            self.counts.add(conn.execute(
                "UPDATE orders SET status = %s, updated_at = now() WHERE id = ANY(%s)",
                (rng.choice(STATUSES), orders)).rowcount)
            self.counts.add(conn.execute(
                "UPDATE customers SET tier = %s, updated_at = now() WHERE id = ANY(%s)",
                (rng.choice(TIERS), hot(rng, 1, self.customers, max(1, updates // 10)))).rowcount)
            self.counts.add(conn.execute(
                "UPDATE products SET price = %s WHERE id = ANY(%s)",
                (Decimal(rng.randint(100, 100_000)) / 100, hot(rng, 1, self.products, max(1, updates // 10)))).rowcount)
            if deletes and self.max_order - self.min_order > 10 * deletes:
                # The oldest orders go: the cold end, away from the updates' hot keys.
                gone = list(range(self.min_order, self.min_order + deletes))
                self.min_order += deletes
                self.counts.add(conn.execute("DELETE FROM order_items WHERE order_id = ANY(%s)", (gone,)).rowcount,
                                deleted=True)
                self.counts.add(conn.execute("DELETE FROM orders WHERE id = ANY(%s)", (gone,)).rowcount,
                                deleted=True)
        self.counts.transactions += 1
        return self.counts.events - before

    def flat_out(self, events: int) -> Counts:
        """About `events` change events, as fast as Postgres takes them."""
        while self.counts.events < events:
            self.transaction(min(CHUNK_EVENTS, max(10, events - self.counts.events)))
        return self.counts

    def steady(self, events_per_s: float, seconds: float, per_transaction: int = 20) -> Counts:
        """`events_per_s` change events per second for `seconds`, in small transactions
        spread evenly (paced by the events each made; when Postgres is slower than the
        rate, the rate is what it allows: no burst to catch up)."""
        start = time.monotonic()
        due = start
        while due - start < seconds:
            due += self.transaction(per_transaction) / events_per_s
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                due = time.monotonic()  # behind: the rate is what Postgres allows
        return self.counts
