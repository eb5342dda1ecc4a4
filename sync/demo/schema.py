"""The demo's tables, created by the demo (and the tests and the benchmark that run it),
never by Lakesync's migrations: on a team's own database Lakesync creates nothing in the
application's schemas.

The demo is an application like any other: its shop (customers, products, orders and
their lines, accounts, payments) in the public schema, its outbox there too (the
application's half of the outbox, sync/outbox.py `ddl`), and the application role
`lakesync_app` writing them. Idempotent: `lakesync demo` runs it on every start.
"""

from __future__ import annotations

from sync.config import ADMIN_ROLE, DEFAULT_SCHEMA, ROLES, Settings
from sync.outbox import ddl as outbox_ddl
from sync.stack.postgres import pg_connect

TABLES = [
    """CREATE TABLE IF NOT EXISTS customers (
        id          bigint PRIMARY KEY,
        name        text NOT NULL,
        email       text UNIQUE,
        tier        text,
        bio         text,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS products (
        id     bigint PRIMARY KEY,
        sku    text UNIQUE NOT NULL,
        name   text NOT NULL,
        price  numeric(12,2) NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS orders (
        id           bigint PRIMARY KEY,
        customer_id  bigint REFERENCES customers(id),
        status       text NOT NULL,
        placed_at    timestamptz NOT NULL DEFAULT now(),
        updated_at   timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS order_items (
        order_id    bigint REFERENCES orders(id) ON DELETE CASCADE,
        line_no     int,
        product_id  bigint REFERENCES products(id),
        qty         int NOT NULL,
        unit_price  numeric(12,2) NOT NULL,
        PRIMARY KEY (order_id, line_no))""",
    """CREATE TABLE IF NOT EXISTS accounts (
        id           bigint PRIMARY KEY,
        customer_id  bigint REFERENCES customers(id),
        currency     char(3) NOT NULL,
        balance      numeric(20,4) NOT NULL DEFAULT 0,
        opened_at    timestamptz NOT NULL DEFAULT now())""",
    # The second stream of the event-time join (projections/event_time/): a table rather
    # than outbox events, so the join of orders with their payments has Postgres as oracle.
    """CREATE TABLE IF NOT EXISTS payments (
        id        bigint PRIMARY KEY,
        order_id  bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
        amount    numeric(12,2) NOT NULL,
        paid_at   timestamptz NOT NULL DEFAULT now())""",
]


def create(settings: Settings) -> None:
    """The demo's tables and outbox in the public schema, written by the application role
    (tables created there later by the admin role too: the tests make their own)."""
    app = ROLES["app"]
    with pg_connect(settings) as conn, conn.transaction():
        for statement in TABLES + outbox_ddl(DEFAULT_SCHEMA):
            conn.execute(statement)
        conn.execute(f"GRANT USAGE ON SCHEMA {DEFAULT_SCHEMA} TO {app}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {DEFAULT_SCHEMA} TO {app}")
        conn.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {ADMIN_ROLE} IN SCHEMA {DEFAULT_SCHEMA} "
                     f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app}")
