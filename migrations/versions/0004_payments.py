"""Payments: the demo's, so no longer created here (sync/demo/schema.py).

Until 2026-11-25 this revision created the demo's `payments` table in the public schema;
a database migrated then keeps it. The revision stays so the chain of revisions does.

Revision ID: 0004
"""

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
