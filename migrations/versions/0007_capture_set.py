"""The capture set (LAKESYNC_CAPTURE) instead of the public schema alone.

0005 and 0006 acted on the tables of the public schema. The schemas captured now are
those of the publication, which `lakesync up` sets to the capture set's schemas
(sync/stack/migrate.py `publish`) after these migrations: the two event triggers read
them from the catalog, so a schema added to the capture set needs no new trigger.
- Every table of a published schema that ends a CREATE or ALTER TABLE without a
  primary key gets REPLICA IDENTITY FULL (Postgres refuses UPDATE and DELETE on a
  published table without a replica identity, whether the capture set's table patterns
  take it or not).
- A DROP TABLE in a published schema is recorded (the mirrors take it as a truncate;
  a table the capture set leaves out has no mirror, so nothing happens).

Revision ID: 0007
"""

from alembic import op

from sync.config import CONTROL_SCHEMA, DEFAULT_SCHEMA, PUBLICATION, TABLE_DROPS_TABLE

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The schemas whose tables the publication carries (FOR TABLES IN SCHEMA), but ours.
PUBLISHED_SCHEMAS = f"""
    SELECT n.nspname FROM pg_publication p JOIN pg_publication_namespace pn ON pn.pnpubid = p.oid
    JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = '{PUBLICATION}' AND n.nspname <> '{CONTROL_SCHEMA}'"""


def _triggers(schemas: str) -> None:
    """Both trigger functions, acting on the tables of `schemas` (a SQL list or query)."""
    keyless = f"""
        SELECT c.oid::regclass AS keyless FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname IN ({schemas}) AND c.relkind = 'r' AND c.relreplident = 'd'
          AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"""
    op.execute(f"""
        CREATE OR REPLACE FUNCTION {CONTROL_SCHEMA}.replica_identity_full_if_keyless() RETURNS event_trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            table_name regclass;
        BEGIN
            FOR table_name IN
                {keyless} AND c.oid IN (SELECT objid FROM pg_event_trigger_ddl_commands() WHERE object_type = 'table')
            LOOP
                EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', table_name);
            END LOOP;
        END $$""")
    op.execute(f"""
        CREATE OR REPLACE FUNCTION {CONTROL_SCHEMA}.record_table_drops() RETURNS event_trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
        BEGIN
            INSERT INTO {TABLE_DROPS_TABLE} (schema_name, table_name)
            SELECT schema_name, object_name FROM pg_event_trigger_dropped_objects()
            WHERE object_type = 'table' AND schema_name IN ({schemas}) AND NOT is_temporary;
        END $$""")


def upgrade() -> None:
    _triggers(PUBLISHED_SCHEMAS)


def downgrade() -> None:
    _triggers(f"'{DEFAULT_SCHEMA}'")  # as 0005 and 0006 made them
