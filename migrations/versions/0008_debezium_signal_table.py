"""Debezium's signal table, for incremental snapshots of tables added to the capture set.

`lakesync capture add` (sync/commands/capture.py) inserts an `execute-snapshot` signal
here; the connector reads it from the WAL (the table is captured, `signal.data.collection`)
and snapshots those tables alone, in chunks, beside the stream. While it does, it writes
and deletes its own watermark rows here (`incremental.snapshot.watermarking.strategy =
insert_delete`), so the capture role may insert and delete, nothing more.

Revision ID: 0008
"""

from alembic import op

from sync.config import ROLES, SIGNAL_TABLE

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Debezium's required shape: id, type, data, in this order.
    op.execute(f"CREATE TABLE {SIGNAL_TABLE} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, "
               "data varchar(2048))")
    op.execute(f"GRANT SELECT, INSERT, DELETE ON {SIGNAL_TABLE} TO {ROLES['capture']}")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {SIGNAL_TABLE}")
