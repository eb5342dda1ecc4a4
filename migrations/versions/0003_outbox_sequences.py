"""The outbox's sequence and guards: the application's, so no longer created here.

Until 2026-11-25 this revision created `outbox_sequence`, the guard function
`lakesync.refuse_outbox_change()` and its triggers on the public schema's outbox. The
outbox is the application's now, created with all of these by its own migration in the
schema it chooses (sync/outbox.py `ddl`); a database migrated before keeps them. The
revision stays so the chain of revisions does.

Revision ID: 0003
"""

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
