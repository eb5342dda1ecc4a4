"""A RENAME COLUMN or DROP COLUMN of a captured table, recorded at its place in the WAL.

pgoutput carries no DDL: after `ALTER TABLE t RENAME COLUMN a TO b` Debezium's events
simply name `b` where they named `a`, exactly as after a DROP COLUMN a and an ADD COLUMN
b. Taken that way, the mirror's rows not changed since would hold null in `b`. So an
event trigger (ddl_command_end of CREATE and ALTER TABLE) keeps the column names of each
table of the published schemas by attnum in COLUMN_NAMES_TABLE, and when an ALTER TABLE
leaves an attnum with another name, or dropped, records that in COLUMN_CHANGES_TABLE,
inside the altering transaction. That table is captured (connectors/), and the mirrors
rename or drop the Delta column at the change's source position (projections/mirrors.py).

`remember_columns()` takes the names of the tables a schema newly published already has
(`lakesync up` runs it after publishing: sync/stack/migrate.py). The functions run as
their owner (SECURITY DEFINER), so a role altering its own table needs no right on
Lakesync's schema; the capture role only reads the record.

Revision ID: 0009
"""

from alembic import op

from sync.config import COLUMN_CHANGES_TABLE, COLUMN_NAMES_TABLE, CONTROL_SCHEMA, PUBLICATION, ROLES

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The tables of the schemas the publication carries (FOR TABLES IN SCHEMA), but ours.
PUBLISHED_TABLES = f"""
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_publication_namespace pn ON pn.pnnspid = n.oid JOIN pg_publication p ON p.oid = pn.pnpubid
    WHERE p.pubname = '{PUBLICATION}' AND n.nspname <> '{CONTROL_SCHEMA}' AND c.relkind IN ('r', 'p')"""


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE {COLUMN_NAMES_TABLE} (
            relid   oid NOT NULL,
            attnum  smallint NOT NULL,
            attname text NOT NULL,
            PRIMARY KEY (relid, attnum)
        )""")
    op.execute(f"""
        CREATE TABLE {COLUMN_CHANGES_TABLE} (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            schema_name text NOT NULL,
            table_name  text NOT NULL,
            change      text NOT NULL CHECK (change IN ('rename', 'drop')),
            old_name    text NOT NULL,
            new_name    text,
            changed_at  timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute(f"GRANT SELECT ON {COLUMN_CHANGES_TABLE} TO {ROLES['capture']}")
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.remember_columns() RETURNS void
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
            DELETE FROM {COLUMN_NAMES_TABLE} s WHERE NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = s.relid);
            INSERT INTO {COLUMN_NAMES_TABLE} (relid, attnum, attname)
            SELECT a.attrelid, a.attnum, a.attname FROM pg_attribute a
            WHERE a.attrelid IN ({PUBLISHED_TABLES}) AND a.attnum > 0 AND NOT a.attisdropped
            ON CONFLICT (relid, attnum) DO UPDATE SET attname = EXCLUDED.attname;
        $$""")
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.record_column_changes() RETURNS event_trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
        DECLARE
            rel oid;
        BEGIN
            FOR rel IN
                SELECT DISTINCT objid FROM pg_event_trigger_ddl_commands()
                WHERE classid = 'pg_class'::regclass AND objid IN ({PUBLISHED_TABLES})
            LOOP
                -- An attnum keeps its column for life: another name is a rename, dropped a drop.
                INSERT INTO {COLUMN_CHANGES_TABLE} (schema_name, table_name, change, old_name, new_name)
                SELECT n.nspname, c.relname, CASE WHEN a.attisdropped THEN 'drop' ELSE 'rename' END, s.attname,
                       CASE WHEN a.attisdropped THEN NULL ELSE a.attname END
                FROM {COLUMN_NAMES_TABLE} s
                JOIN pg_attribute a ON a.attrelid = s.relid AND a.attnum = s.attnum
                JOIN pg_class c ON c.oid = s.relid JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE s.relid = rel AND (a.attisdropped OR a.attname <> s.attname)
                ORDER BY s.attnum;
                DELETE FROM {COLUMN_NAMES_TABLE} WHERE relid = rel;
                INSERT INTO {COLUMN_NAMES_TABLE} (relid, attnum, attname)
                SELECT attrelid, attnum, attname FROM pg_attribute
                WHERE attrelid = rel AND attnum > 0 AND NOT attisdropped;
            END LOOP;
        END $$""")
    op.execute(f"""
        CREATE EVENT TRIGGER lakesync_record_column_changes ON ddl_command_end
        WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
        EXECUTE FUNCTION {CONTROL_SCHEMA}.record_column_changes()""")
    op.execute(f"SELECT {CONTROL_SCHEMA}.remember_columns()")


def downgrade() -> None:
    op.execute("DROP EVENT TRIGGER IF EXISTS lakesync_record_column_changes")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.record_column_changes()")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.remember_columns()")
    op.execute(f"DROP TABLE IF EXISTS {COLUMN_CHANGES_TABLE}")
    op.execute(f"DROP TABLE IF EXISTS {COLUMN_NAMES_TABLE}")
