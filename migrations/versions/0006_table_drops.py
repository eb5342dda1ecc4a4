"""A DROP TABLE of a captured table, recorded at its place in the WAL.

pgoutput carries no DDL, so Debezium sends nothing for a DROP TABLE: a table dropped and
created again under its name would reach its mirror as one table, the dropped rows
beside the new ones. An event trigger (sql_drop) records each table of the captured
schema dropped in TABLE_DROPS_TABLE, inside the dropping transaction. That table is
captured (connectors/), and the mirrors take each drop as a truncate of the table at the
drop's source position (projections/mirrors.py). The function runs as its owner
(SECURITY DEFINER), so a role that drops its own table needs no right on Lakesync's
schema; the capture role only reads the table.

Revision ID: 0006
"""

from alembic import op

from sync.config import DEFAULT_SCHEMA, CONTROL_SCHEMA, ROLES, TABLE_DROPS_TABLE

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE {TABLE_DROPS_TABLE} (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            schema_name text NOT NULL,
            table_name  text NOT NULL,
            dropped_at  timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute(f"GRANT SELECT ON {TABLE_DROPS_TABLE} TO {ROLES['capture']}")
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.record_table_drops() RETURNS event_trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
        BEGIN
            INSERT INTO {TABLE_DROPS_TABLE} (schema_name, table_name)
            SELECT schema_name, object_name FROM pg_event_trigger_dropped_objects()
            WHERE object_type = 'table' AND schema_name = '{DEFAULT_SCHEMA}' AND NOT is_temporary;
        END $$""")
    op.execute(f"""
        CREATE EVENT TRIGGER lakesync_record_table_drops ON sql_drop
        EXECUTE FUNCTION {CONTROL_SCHEMA}.record_table_drops()""")


def downgrade() -> None:
    op.execute("DROP EVENT TRIGGER IF EXISTS lakesync_record_table_drops")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.record_table_drops()")
    op.execute(f"DROP TABLE IF EXISTS {TABLE_DROPS_TABLE}")
