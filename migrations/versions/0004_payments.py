"""Payments: the second stream of the event-time join (projections/event_time/).

One row per payment of an order, with when it was paid (its event time). A table rather
than outbox events, so the join of orders with their payments has Postgres as its
oracle (projections/event_time/, ORDER_PAYMENTS_SQL). The publication covers the
schema and the grants come from 0001's default privileges, so capture needs nothing
more; the primary key satisfies 0002's rule.

Revision ID: 0004
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE payments (
            id        bigint PRIMARY KEY,
            order_id  bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
            amount    numeric(12,2) NOT NULL,
            paid_at   timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS payments")
