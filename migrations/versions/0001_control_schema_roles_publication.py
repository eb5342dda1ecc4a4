"""Lakesync's control schema, its heartbeat, least-privilege roles, and the publication.

Nothing here touches the application's schemas: the capture set's grants and the
publication's schemas are set by `lakesync up` (sync/stack/migrate.py `publish`), and
the demo's tables by the demo (sync/demo/schema.py). Until 2026-11-25 this revision also
created the demo's tables in the public schema; a database migrated then keeps them.

Roles (cluster-wide, so created only if absent):
- lakesync_app: the demo application's role (sync/demo/schema.py grants it its tables).
- lakesync_capture: Debezium; REPLICATION plus SELECT on the captured tables (for the
  snapshot) and write access to the one heartbeat row its heartbeat query touches.
- lakesync_auditor: read-only, and its sessions are read-only by default.

The publication is created here, by the owner, FOR TABLES IN SCHEMA (the control schema;
`up` adds the captured ones), so tables created later are published too and the
connector never needs to create it (superuser-only).

Revision ID: 0001
"""

from alembic import op
from sqlalchemy import text

from sync.config import CONTROL_SCHEMA, PUBLICATION, ROLES, load, read_secrets

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


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

    op.execute(f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}")
    op.execute(f"CREATE TABLE {CONTROL_SCHEMA}.heartbeat (id int PRIMARY KEY, beat_at timestamptz NOT NULL)")

    _create_role(app, "NOREPLICATION", secrets.get("app_password"))
    _create_role(capture, "REPLICATION", secrets.get("capture_password"))
    _create_role(auditor, "NOREPLICATION", secrets.get("auditor_password"))
    op.execute(f"ALTER ROLE {auditor} SET default_transaction_read_only = on")

    op.execute(f"GRANT USAGE ON SCHEMA {CONTROL_SCHEMA} TO {capture}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {CONTROL_SCHEMA}.heartbeat TO {capture}")

    op.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLES IN SCHEMA {CONTROL_SCHEMA}")


def downgrade() -> None:
    op.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
    op.execute(f"DROP SCHEMA IF EXISTS {CONTROL_SCHEMA} CASCADE")
    for role in ROLES.values():
        op.execute(f"DROP OWNED BY {role}")
        op.execute(f"DROP ROLE IF EXISTS {role}")
