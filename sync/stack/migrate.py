"""Apply the Alembic migrations in migrations/ to the source database, then the capture set."""

from __future__ import annotations

from psycopg import sql

from sync.config import CONTROL_SCHEMA, PUBLICATION, ROLES, ROOT, Settings, sqlalchemy_url
from sync.errors import StackError
from sync.stack.postgres import pg_connect


def upgrade(settings: Settings) -> None:
    # Alembic (and SQLAlchemy under it) imported here, not with the module: 0.3 s of every
    # command's start otherwise (`wait`, `status`: sync.stack imports this module), and
    # only `up` migrates.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(settings.pg_dsn).replace("%", "%%"))
    try:
        command.upgrade(config, "head")
    except RuntimeError as refused:  # a migration's own check, worded for the user
        raise StackError(f"migrations refused: {refused}") from None
    publish(settings)


def schema_owners(conn, settings: Settings) -> dict[str, str]:
    """Each schema of the capture set, with its owner; one that does not exist: one line
    naming it (Lakesync creates nothing in the application's schemas)."""
    schemas = settings.capture.schemas
    owners = dict(conn.execute("SELECT nspname, pg_get_userbyid(nspowner) FROM pg_namespace "
                               "WHERE nspname = ANY(%s)", (schemas,)).fetchall())
    missing = [schema for schema in schemas if schema not in owners]
    if missing:
        raise StackError(f"the capture set names schema {', '.join(missing)}, which database "
                         f"{settings.pg_database} does not have: create it first, or leave it out")
    return owners


def publish(settings: Settings) -> None:
    """The capture set (LAKESYNC_CAPTURE, and what `lakesync capture add` added) into the
    database, in one transaction, on every `up` and `capture` (idempotent; the
    connector's include list is rendered from the same set):
      1. every schema it names exists (Lakesync creates nothing in the application's
         schemas: one line naming what is missing, and nothing changed);
      2. their tables without a primary key get REPLICA IDENTITY FULL, before the
         publication covers them: Postgres refuses UPDATE and DELETE of a published
         table without a replica identity (migration 0007's trigger does the same for
         tables created later);
      3. the publication carries exactly those schemas and the control schema, so
         tables created in them later are published too;
      4. the capture and auditor roles may read their tables, those created later by
         the schema's owner or this role too (Debezium's snapshots read them; streaming
         needs only the publication);
      5. the column names of their tables are remembered, so a later RENAME or DROP
         COLUMN is recorded (migration 0009).
    """
    schemas = settings.capture.schemas
    readers = sql.SQL(", ").join(sql.Identifier(ROLES[kind]) for kind in ("capture", "auditor"))
    with pg_connect(settings) as conn, conn.transaction():
        owners = schema_owners(conn, settings)
        (me,) = conn.execute("SELECT current_user").fetchone()
        keyless = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind = 'r' AND c.relreplident = 'd' "
            "AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)",
            (schemas,)).fetchall()
        for schema, table in keyless:
            conn.execute(sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                sql.Identifier(schema), sql.Identifier(table)))
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLES IN SCHEMA {}").format(
            sql.Identifier(PUBLICATION), sql.SQL(", ").join(map(sql.Identifier, [*schemas, CONTROL_SCHEMA]))))
        for schema in schemas:
            name = sql.Identifier(schema)
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(name, readers))
            conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(name, readers))
            # (Postgres 15 gives the public schema to pg_database_owner, which owns no table.)
            for owner in sorted({owners[schema], me} - {"pg_database_owner"}):
                conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT SELECT ON TABLES TO {}")
                             .format(sql.Identifier(owner), name, readers))
        conn.execute(sql.SQL("SELECT {}.remember_columns()").format(sql.Identifier(CONTROL_SCHEMA)))
