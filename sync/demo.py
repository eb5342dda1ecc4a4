"""`lakesync demo`: the whole path on the embedded stack, in a few minutes.

up -> seed the demo schema -> start the runner -> a mixed insert/update/delete workload
(multi-table transactions included) -> `wait` -> a table of Postgres vs Delta row
counts per table and the verify result. The stack and the runner stay up afterwards.
"""

from __future__ import annotations

import random
import sys
from decimal import Decimal

import psycopg

from sync import config, stack
from sync.config import ROLES, Settings
from sync.runner import start_background

TIERS = ["bronze", "silver", "gold", "platinum"]
STATUSES = ["placed", "paid", "shipped", "delivered", "cancelled"]


def app_connect(settings: Settings) -> psycopg.Connection:
    """The application's own role: it may write the demo tables and nothing else."""
    return psycopg.connect(config.role_dsn(settings, ROLES["app"]))


def seed(conn: psycopg.Connection, rng: random.Random, customers: int = 200, products: int = 50,
         orders: int = 300) -> None:
    if conn.execute("SELECT 1 FROM customers WHERE id = 1").fetchone():
        return  # seeded before
    with conn.transaction():
        conn.cursor().executemany(
            "INSERT INTO customers (id, name, email, tier, bio) VALUES (%s, %s, %s, %s, %s)",
            [(i, f"Customer {i}", f"c{i}@example.com", rng.choice(TIERS), _bio(rng, i)) for i in range(1, customers + 1)])
        conn.cursor().executemany(
            "INSERT INTO products (id, sku, name, price) VALUES (%s, %s, %s, %s)",
            [(i, f"SKU-{i:05d}", f"Product {i}", _price(rng)) for i in range(1, products + 1)])
        conn.cursor().executemany(
            "INSERT INTO accounts (id, customer_id, currency, balance) VALUES (%s, %s, %s, %s)",
            [(i, i, rng.choice(["EUR", "USD"]), Decimal(rng.randint(0, 10_000_00)) / 100)
             for i in range(1, customers + 1)])
    for order_id in range(1, orders + 1):
        place_order(conn, rng, order_id, rng.randint(1, customers), list(range(1, products + 1)))


def place_order(conn: psycopg.Connection, rng: random.Random, order_id: int, customer_id: int,
                products: list[int]) -> None:
    """One multi-table transaction: an order and its lines (of products chosen from `products`)."""
    with conn.transaction():
        conn.execute("INSERT INTO orders (id, customer_id, status) VALUES (%s, %s, 'placed')", (order_id, customer_id))
        conn.cursor().executemany(
            "INSERT INTO order_items (order_id, line_no, product_id, qty, unit_price) "
            "SELECT %s, %s, id, %s, price FROM products WHERE id = %s",
            [(order_id, line, rng.randint(1, 5), rng.choice(products)) for line in range(1, rng.randint(2, 5))])


def workload(conn: psycopg.Connection, rng: random.Random, operations: int = 500) -> int:
    """Mixed inserts, updates and deletes across the demo tables; returns operations done."""
    (max_order,) = conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()
    customers = [r[0] for r in conn.execute("SELECT id FROM customers ORDER BY id")]
    products = [r[0] for r in conn.execute("SELECT id FROM products ORDER BY id")]
    accounts = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")] or [0]
    for _ in range(operations):
        action = rng.random()
        with conn.transaction():
            if action < 0.25:
                conn.execute("UPDATE customers SET tier = %s, updated_at = now() WHERE id = %s",
                             (rng.choice(TIERS), rng.choice(customers)))
            elif action < 0.40:
                conn.execute("UPDATE products SET price = %s WHERE id = %s", (_price(rng), rng.choice(products)))
            elif action < 0.60:
                max_order += 1
                place_order(conn, rng, max_order, rng.choice(customers), products)
            elif action < 0.80:
                conn.execute("UPDATE orders SET status = %s, updated_at = now() WHERE id = %s",
                             (rng.choice(STATUSES), rng.randint(1, max_order)))
            elif action < 0.90:
                conn.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, max_order),))
            else:
                conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                             (Decimal(rng.randint(-5000, 5000)) / 100, rng.choice(accounts)))
    return operations


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(100, 100_000)) / 100


def _bio(rng: random.Random, i: int) -> str:
    # Long enough (about 4 kB of incompressible text) to be TOASTed out of line.
    return f"Customer {i}: " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(4000))


def main(settings: Settings) -> int:
    from sync import freshness, verify

    print(f"1/5 starting the embedded stack in {settings.home}")
    stack.up(settings)
    rng = random.Random(42)
    print("2/5 seeding the demo schema")
    with app_connect(settings) as conn:
        conn.autocommit = True
        seed(conn, rng)
    print("3/5 starting the runner (one Spark driver for every projection)")
    start_background(settings)
    print("4/5 running a mixed insert/update/delete workload")
    with app_connect(settings) as conn:
        conn.autocommit = True
        done = workload(conn, rng)
    print(f"    {done} transactions committed; waiting until Delta reflects them all")
    took = freshness.wait(settings, timeout=600)
    print(f"    fresh after {took:.1f}s")
    print("5/5 comparing every mirror with Postgres")
    reports = verify.verify(settings)
    print(f"\n{'table':<16} {'postgres rows':>14} {'delta rows':>11} {'differences':>12}")
    for r in reports:
        print(f"{r.name.split('.', 1)[-1]:<16} {r.source_rows:>14} {r.target_rows:>11} {r.differences:>12}")
    ok = all(r.differences == 0 for r in reports)
    print("\nverify: no difference" if ok else "\nverify: DIFFERENCES FOUND (see `lakesync verify`)")
    print("\nThe stack and the runner stay up: try `lakesync status`, or `lakesync down` to stop.")
    sys.stdout.flush()
    return 0 if ok else 1
