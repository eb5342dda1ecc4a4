"""Demo schema (docs/architecture.md), least-privilege roles, and the publication.

Roles (cluster-wide, so created only if absent):
- lakesync_app: the application; reads and writes the demo tables, nothing else.
- lakesync_capture: Debezium; REPLICATION plus SELECT on the captured tables (for the
  snapshot) and write access to the one heartbeat row its heartbeat query touches.
- lakesync_auditor: read-only, and its sessions are read-only by default.

The publication is created here, by the owner, FOR TABLES IN SCHEMA, so tables created
later are published too and the connector never needs to create it (superuser-only).

Revision ID: 0001
"""

from alembic import op
from sqlalchemy import text

from sync.config import ADMIN_ROLE, CONTROL_SCHEMA, PUBLICATION, ROLES, load, read_secrets

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = """
CREATE TABLE customers (
    id          bigint PRIMARY KEY,
    name        text NOT NULL,
    email       text UNIQUE,
    tier        text,
    bio         text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE products (
    id     bigint PRIMARY KEY,
    sku    text UNIQUE NOT NULL,
    name   text NOT NULL,
    price  numeric(12,2) NOT NULL
);
CREATE TABLE orders (
    id           bigint PRIMARY KEY,
    customer_id  bigint REFERENCES customers(id),
    status       text NOT NULL,
    placed_at    timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_items (
    order_id    bigint REFERENCES orders(id) ON DELETE CASCADE,
    line_no     int,
    product_id  bigint REFERENCES products(id),
    qty         int NOT NULL,
    unit_price  numeric(12,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE accounts (
    id           bigint PRIMARY KEY,
    customer_id  bigint REFERENCES customers(id),
    currency     char(3) NOT NULL,
    balance      numeric(20,4) NOT NULL DEFAULT 0,
    opened_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE outbox (
    id              uuid PRIMARY KEY,
    aggregate_type  text NOT NULL,
    aggregate_id    text NOT NULL,
    seq             bigint NOT NULL,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    occurred_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (aggregate_type, aggregate_id, seq)
);
"""


def _sql(statement: str, **params) -> None:
    op.get_bind().execute(text(statement), params)


def _create_role(role: str, options: str, password: str | None) -> None:
    exists = op.get_bind().execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).scalar()
    verb = "ALTER" if exists else "CREATE"
    op.execute(f"{verb} ROLE {role} WITH LOGIN {options}")
    if password:
        # Role passwords cannot be bound parameters; quote_literal does the escaping.
        literal = op.get_bind().execute(text("SELECT quote_literal(:p)"), {"p": password}).scalar()
        op.execute(f"ALTER ROLE {role} WITH PASSWORD {literal}")


def upgrade() -> None:
    secrets = read_secrets(load())
    app, capture, auditor = ROLES["app"], ROLES["capture"], ROLES["auditor"]

    for statement in TABLES.split(";"):
        if statement.strip():
            op.execute(statement)
    op.execute(f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}")
    op.execute(f"CREATE TABLE {CONTROL_SCHEMA}.heartbeat (id int PRIMARY KEY, beat_at timestamptz NOT NULL)")

    _create_role(app, "NOREPLICATION", secrets.get("app_password"))
    _create_role(capture, "REPLICATION", secrets.get("capture_password"))
    _create_role(auditor, "NOREPLICATION", secrets.get("auditor_password"))
    op.execute(f"ALTER ROLE {auditor} SET default_transaction_read_only = on")

    op.execute(f"GRANT USAGE ON SCHEMA public TO {app}, {capture}, {auditor}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app}")
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {capture}, {auditor}")
    for owner in (ADMIN_ROLE, app):
        op.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public "
                   f"GRANT SELECT ON TABLES TO {capture}, {auditor}")
    op.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {ADMIN_ROLE} IN SCHEMA public "
               f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {app}")
    op.execute(f"GRANT USAGE ON SCHEMA {CONTROL_SCHEMA} TO {capture}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {CONTROL_SCHEMA}.heartbeat TO {capture}")

    op.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLES IN SCHEMA public, {CONTROL_SCHEMA}")


def downgrade() -> None:
    op.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
    op.execute(f"DROP SCHEMA IF EXISTS {CONTROL_SCHEMA} CASCADE")
    for table in ("outbox", "accounts", "order_items", "orders", "products", "customers"):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    for role in ROLES.values():
        op.execute(f"DROP OWNED BY {role}")
        op.execute(f"DROP ROLE IF EXISTS {role}")
