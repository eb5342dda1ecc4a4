"""The outbox's per-aggregate sequence, and the outbox's own guards.

`outbox_sequence` holds the last sequence number given to each aggregate. `emit`
(sync/outbox.py) takes the next one with a single upsert, which locks that aggregate's
row until the application's transaction ends: two concurrent writers of one aggregate
queue behind each other, so the sequence has no gap, no repeat, and follows commit
order. The outbox rows themselves are deleted in the transaction that inserts them
(the WAL keeps them for Debezium), so the sequence cannot come from the outbox.

The outbox is an event stream, not state: Debezium's Outbox Event Router turns each
insert into an event and ignores deletes. An UPDATE of an outbox row would be dropped
by the router with only a warning, and a TRUNCATE would stop the connector, so both
are refused here, where the application sees the error.

Revision ID: 0003
"""

from alembic import op

from sync.config import CONTROL_SCHEMA

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE outbox_sequence (
            aggregate_type  text NOT NULL,
            aggregate_id    text NOT NULL,
            last_seq        bigint NOT NULL,
            PRIMARY KEY (aggregate_type, aggregate_id)
        )""")
    op.execute(f"""
        CREATE FUNCTION {CONTROL_SCHEMA}.refuse_outbox_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'lakesync: % on the outbox is refused: outbox rows are events, '
                            'written once by sync.outbox.emit and never changed', TG_OP
                USING ERRCODE = 'insufficient_privilege';
        END $$""")
    op.execute(f"""
        CREATE TRIGGER outbox_no_update BEFORE UPDATE ON outbox
        FOR EACH ROW EXECUTE FUNCTION {CONTROL_SCHEMA}.refuse_outbox_change()""")
    op.execute(f"""
        CREATE TRIGGER outbox_no_truncate BEFORE TRUNCATE ON outbox
        FOR EACH STATEMENT EXECUTE FUNCTION {CONTROL_SCHEMA}.refuse_outbox_change()""")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_no_truncate ON outbox")
    op.execute("DROP TRIGGER IF EXISTS outbox_no_update ON outbox")
    op.execute(f"DROP FUNCTION IF EXISTS {CONTROL_SCHEMA}.refuse_outbox_change()")
    op.execute("DROP TABLE IF EXISTS outbox_sequence")
