"""Every captured table has a primary key: the rule for keyless tables.

A table of the captured schema without a primary key would break two things. Postgres
refuses UPDATE and DELETE on a published table without a replica identity, so the
application's own writes would fail; and Debezium would send its changes with a null
Kafka key, which a compacted topic refuses, so the connector would stop for every
table. Mirrors, tombstones and the newer-than guard all need a key as well.

So the rule is a clear refusal at DDL time, before any row is written: an event trigger
rejects CREATE TABLE / ALTER TABLE that leave a table of the captured schema without a
primary key, naming the table and what to do. Keyless tables belong in another schema,
which is not captured.

Replaced by 0005 (keyless tables are captured, with REPLICA IDENTITY FULL). So that a
database which already has keyless tables can be brought to 0005, this revision no
longer refuses them when it runs.

Revision ID: 0002
"""

from alembic import op

from sync.config import DEFAULT_SCHEMA, CONTROL_SCHEMA

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

MESSAGE = ("lakesync: table %s has no primary key. Every table of schema " + DEFAULT_SCHEMA +
           " is captured and mirrored by its key; add a PRIMARY KEY, or keep the table in another schema.")


def upgrade() -> None:
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.require_primary_key() RETURNS event_trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            created record;
        BEGIN
            FOR created IN
                SELECT objid, object_identity FROM pg_event_trigger_ddl_commands()
                WHERE object_type = 'table' AND schema_name = '{DEFAULT_SCHEMA}'
            LOOP
                IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = created.objid AND indisprimary)
                   AND NOT (SELECT relispartition FROM pg_class WHERE oid = created.objid) THEN
                    RAISE EXCEPTION '{MESSAGE.replace("%s", "%")}', created.object_identity
                        USING ERRCODE = 'invalid_table_definition';
                END IF;
            END LOOP;
        END $$""")
    op.execute(f"""
        CREATE EVENT TRIGGER lakesync_require_primary_key ON ddl_command_end
        WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
        EXECUTE FUNCTION {CONTROL_SCHEMA}.require_primary_key()""")


def downgrade() -> None:
    op.execute("DROP EVENT TRIGGER IF EXISTS lakesync_require_primary_key")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.require_primary_key()")
