"""Tables without a primary key are captured: REPLICA IDENTITY FULL instead of a refusal.

0002 refused them, since Postgres refuses UPDATE and DELETE on a published table without
a replica identity and a compacted topic refuses a record without a key. Refusing the
application's DDL made Lakesync unusable for schemas that have such tables (pgbench's
own `pgbench_history`; `pgbench -i` adds its other primary keys only after loading).
Now:
- an event trigger gives every table of the captured schema that ends a CREATE or
  ALTER TABLE without a primary key (and with the default identity, which is none for
  such a table) REPLICA IDENTITY FULL: Postgres accepts its UPDATE and DELETE, and each
  change carries the whole old row, which is how the mirror finds the row it replaces;
- the Connect transform KeyKeylessRecords (jvm/smt) keys its changes so the compacted
  topic keeps every one, and the mirrors keep the table as a multiset (duplicates
  included: sync/delta/multiset.py).
An identity the application chose (USING INDEX, NOTHING, FULL) is left alone. The
trigger's own ALTER TABLE ends with the identity set, so it does not recurse.

Revision ID: 0005
"""

from alembic import op

from sync.config import DEFAULT_SCHEMA, CONTROL_SCHEMA

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

KEYLESS = f"""
    SELECT c.oid::regclass AS keyless FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = '{DEFAULT_SCHEMA}' AND c.relkind = 'r' AND c.relreplident = 'd'
      AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"""


def upgrade() -> None:
    op.execute("DROP EVENT TRIGGER IF EXISTS lakesync_require_primary_key")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.require_primary_key()")
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.replica_identity_full_if_keyless() RETURNS event_trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            table_name regclass;
        BEGIN
            FOR table_name IN
                {KEYLESS} AND c.oid IN (SELECT objid FROM pg_event_trigger_ddl_commands() WHERE object_type = 'table')
            LOOP
                EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', table_name);
            END LOOP;
        END $$""")
    op.execute(f"""
        CREATE EVENT TRIGGER lakesync_replica_identity_full_if_keyless ON ddl_command_end
        WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
        EXECUTE FUNCTION {CONTROL_SCHEMA}.replica_identity_full_if_keyless()""")
    op.execute(f"DO $$ DECLARE table_name regclass; BEGIN FOR table_name IN {KEYLESS} LOOP "
               "EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', table_name); END LOOP; END $$")


def downgrade() -> None:
    op.execute("DROP EVENT TRIGGER IF EXISTS lakesync_replica_identity_full_if_keyless")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.replica_identity_full_if_keyless()")
