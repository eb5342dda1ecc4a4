"""`lakesync demo`: the whole path on the embedded stack, in a few minutes.

up -> the demo's tables (sync/demo/schema.py) and seed -> start the runner -> a mixed
insert/update/delete workload (multi-table transactions included) while bank clients
move money concurrently through the outbox -> `wait` -> a table of Postgres vs Delta
row counts per table, the verify result, a few ledger lines and `ledger verify`. The
stack and the runner stay up.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterable
from decimal import Decimal

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

from sync import config, stack
from sync.config import ROLES, Settings
from sync.demo import bank, schema
from sync.stack.background import start_background

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
        # Balances start at zero: money only ever arrives through the bank (and its events).
        conn.cursor().executemany(
            "INSERT INTO accounts (id, customer_id, currency) VALUES (%s, %s, %s)",
            [(i, i, rng.choice(sorted(bank.HOUSE))) for i in range(1, customers + 1)])
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
            else:
                conn.execute("DELETE FROM orders WHERE id = %s", (rng.randint(1, max_order),))
    return operations


def open_accounts(session: Session, rng: random.Random) -> None:
    """The bank's cash accounts, and an opening deposit for every customer account."""
    with session.begin():
        bank.open_house_accounts(session)
        opened = session.execute(text("SELECT id FROM accounts WHERE id > 0 AND balance = 0 ORDER BY id"))
        for (account,) in opened.all():
            bank.deposit(session, account, Decimal(rng.randint(100_00, 5_000_00)) / 100)


def bank_clients(settings: Settings, seed: int, clients: int = 3, operations: int = 100,
                 accounts: Iterable[int] | None = None) -> dict[str, int]:
    """`clients` concurrent clients, each doing `operations` bank operations (mostly
    transfers, hot accounts more often, now and then the reversal of a transfer), each
    operation one transaction, on `accounts` (every customer's account if None). Returns
    how many committed and how many the bank refused (not enough funds, or a transfer to
    itself)."""
    engine = bank.engine(config.role_dsn(settings, ROLES["app"]))
    wanted = None if accounts is None else set(accounts)
    with Session(engine) as session:
        by_currency: dict[str, list[int]] = {}
        for account, currency in session.execute(text("SELECT id, currency FROM accounts WHERE id > 0 ORDER BY id")):
            if wanted is None or account in wanted:
                by_currency.setdefault(currency, []).append(account)
    counts = {"committed": 0, "refused": 0}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client(number: int) -> None:
        try:
            operate(number)
        except BaseException as error:  # re-raised by the caller, not lost with the thread
            failures.append(error)

    def operate(number: int) -> None:
        rng = random.Random(seed * 100 + number)
        last_transfer = None
        with Session(engine) as session:
            for _ in range(operations):
                # Skew: the first few accounts of a currency take a third of the traffic.
                accounts = by_currency[rng.choice(sorted(by_currency))]
                pick = lambda: rng.choice(accounts[:5] if rng.random() < 0.33 else accounts)  # noqa: E731
                amount = Decimal(rng.randint(1, 200_00)) / 100
                action = rng.random()
                try:
                    with session.begin():
                        if action < 0.05 and last_transfer:  # a correction: a new, compensating operation
                            bank.reverse(session, *last_transfer)
                            last_transfer = None
                        elif action < 0.7:
                            source, target = pick(), pick()
                            operation = bank.transfer(session, source, target, amount)
                            last_transfer = (operation, [bank.Posting(source, -amount), bank.Posting(target, amount)])
                        elif action < 0.85:
                            bank.deposit(session, pick(), amount)
                        else:
                            bank.withdraw(session, pick(), amount)
                    outcome = "committed"
                except bank.Refused:
                    outcome = "refused"
                with lock:
                    counts[outcome] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    if failures:
        raise failures[0]
    return counts


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(100, 100_000)) / 100


def _bio(rng: random.Random, i: int) -> str:
    # Long enough (about 4 kB of incompressible text) to be TOASTed out of line.
    return f"Customer {i}: " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(4000))


def show_views(settings: Settings) -> None:
    """One order document and one customer summary row, as a Delta reader sees them."""
    import json

    from projections.views import customer_order_summary, order_docs
    from sync.streaming import spark as spark_session

    spark = spark_session.session(settings, "lakesync-verify")  # verify's session, still open
    doc = (spark.read.format("delta").load(order_docs.path(settings))
           .where("NOT deleted AND customer IS NOT NULL AND size(lines) > 1").orderBy("order_id").first())
    if doc is not None:
        print("\none order document (view.order_docs):")
        print(json.dumps(doc.asDict(recursive=True), indent=2, default=str))
        summary = (spark.read.format("delta").load(customer_order_summary.path(settings))
                   .where(f"customer_id = {doc['customer']['id']}").first() if doc["customer"] else None)
        if summary is not None:
            print("its customer's summary (view.customer_order_summary):")
            print(json.dumps({k: v for k, v in summary.asDict().items() if k != "_applied_at"}, default=str))


def main(settings: Settings, external: bool = False) -> int:
    from projections.ledger import audit, balances_path, ledger_path
    from sync.commands import freshness, verify

    if external:
        print("1/6 migrations and the connector on your own services (addresses from the environment)")
        stack.connect_external(settings)
    else:
        print(f"1/6 starting the embedded stack in {settings.home}")
        stack.up(settings)
    schema.create(settings)  # the demo's tables: the demo is an application like any other
    rng = random.Random(42)
    print("2/6 seeding the demo schema and opening the bank's accounts")
    with app_connect(settings) as conn:
        conn.autocommit = True
        seed(conn, rng)
    engine = bank.engine(config.role_dsn(settings, ROLES["app"]))
    with Session(engine) as session:
        open_accounts(session, rng)
    engine.dispose()
    print("3/6 starting the runner (one Spark driver for every projection)")
    start_background(settings)
    print("4/6 a mixed insert/update/delete workload, while 3 bank clients move money")
    bank_run: dict[str, int] = {}
    failed: list[BaseException] = []

    def move_money() -> None:
        try:
            bank_run.update(bank_clients(settings, seed=42))
        except BaseException as error:  # re-raised below, not lost with the thread
            failed.append(error)

    clients = threading.Thread(target=move_money)
    clients.start()
    with app_connect(settings) as conn:
        conn.autocommit = True
        done = workload(conn, rng)
    clients.join()
    if failed:
        raise failed[0]
    print(f"    {done} transactions committed, and {bank_run.get('committed', 0)} bank operations "
          f"({bank_run.get('refused', 0)} refused by the bank's rules); waiting until Delta reflects them all")
    took = freshness.wait(settings, timeout=600)
    print(f"    fresh after {took:.1f}s")
    print("5/6 comparing every projection with Postgres")
    reports = verify.verify(settings)
    width = max([len("projection"), *(len(r.name) for r in reports)])
    print(f"\n{'projection':<{width}} {'postgres rows':>14} {'delta rows':>11} {'differences':>12}")
    for r in reports:
        print(f"{r.name:<{width}} {r.source_rows:>14} {r.target_rows:>11} {r.differences:>12}")
    ok = all(r.differences == 0 for r in reports)
    print("\nverify: no difference" if ok else "\nverify: DIFFERENCES FOUND (see `lakesync verify`)")
    show_views(settings)
    print("6/6 the ledger, as an auditor sees it")
    print(audit.format_entries(audit.history(ledger_path(settings), 1)[-4:]))
    problems, summary = audit.verify(ledger_path(settings), balances=balances_path(settings))
    print(f"ledger verify: {'OK' if not problems else 'BROKEN: ' + problems[0]} "
          f"({summary.get('entries', 0)} entries in {summary.get('accounts', 0)} chains, "
          f"Delta version {summary['version']})")
    print("\nThe stack and the runner stay up: try `lakesync status`, `lakesync ledger history 1`, "
          "or `lakesync down` to stop.")
    sys.stdout.flush()
    return 0 if ok and not problems else 1

