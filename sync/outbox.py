"""The outbox: an application's events, written in the same transaction as its state.

Instead of writing the database and then a broker (two systems, no shared commit: a
crash between them loses the event, a retry duplicates it, two writers reorder it), the
application calls `emit` inside its own transaction. The event becomes one row of the
`outbox` table and commits or rolls back with the state change. Debezium reads it from
the WAL, and its Outbox Event Router publishes it to `lakesync.events.<aggregate_type>`,
keyed by aggregate id, a topic that is never compacted nor deleted by time.

Steps of `emit`, all inside the caller's transaction:
  1. Take the aggregate's next sequence number: one upsert on `outbox_sequence`, which
     locks the aggregate's row until the transaction ends, so concurrent writers of one
     aggregate queue up and the numbers follow commit order with no gap or repeat.
  2. Insert the outbox row with a fresh event id (UUID): consumers deduplicate on it.
  3. Delete the row again. The WAL already holds the insert, which is all Debezium
     needs (the router ignores deletes), and the table stays empty.

The outbox is the application's, in its own schema: `ddl(schema)` gives the statements
that create it (the tables and their guards), for the application's own migrations (an
Alembic revision: docs/outbox-and-ledger.md) after Lakesync's. The schema must be in the
capture set, and the outbox table named by LAKESYNC_OUTBOX (the router reads that one).
`emit` writes `outbox` and `outbox_sequence` as the session's search_path finds them.

This module imports neither Spark nor Delta: applications import it on its own.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sync.config import EVENTS_TOPIC_PREFIX, pg_quoted  # the router's topics: the prefix, then the type

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def ddl(schema: str) -> list[str]:
    """The outbox in `schema`, idempotent: the outbox table; the per-aggregate sequence
    `emit` takes its numbers from (the outbox rows are deleted as soon as written, so
    the numbers cannot come from them); and the guards refusing UPDATE and TRUNCATE of
    outbox rows, where the application sees the error (the router would drop an update
    with only a warning, and a truncate would stop the connector)."""
    name = pg_quoted(schema)
    return [
        f"""CREATE TABLE IF NOT EXISTS {name}.outbox (
            id              uuid PRIMARY KEY,
            aggregate_type  text NOT NULL,
            aggregate_id    text NOT NULL,
            seq             bigint NOT NULL,
            event_type      text NOT NULL,
            payload         jsonb NOT NULL,
            occurred_at     timestamptz NOT NULL DEFAULT now(),
            UNIQUE (aggregate_type, aggregate_id, seq))""",
        f"""CREATE TABLE IF NOT EXISTS {name}.outbox_sequence (
            aggregate_type  text NOT NULL,
            aggregate_id    text NOT NULL,
            last_seq        bigint NOT NULL,
            PRIMARY KEY (aggregate_type, aggregate_id))""",
        f"""CREATE OR REPLACE FUNCTION {name}.refuse_outbox_change() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'lakesync: % on the outbox is refused: outbox rows are events, '
                                'written once by sync.outbox.emit and never changed', TG_OP
                    USING ERRCODE = 'insufficient_privilege';
            END $$""",
        f"""CREATE OR REPLACE TRIGGER outbox_no_update BEFORE UPDATE ON {name}.outbox
            FOR EACH ROW EXECUTE FUNCTION {name}.refuse_outbox_change()""",
        f"""CREATE OR REPLACE TRIGGER outbox_no_truncate BEFORE TRUNCATE ON {name}.outbox
            FOR EACH STATEMENT EXECUTE FUNCTION {name}.refuse_outbox_change()""",
    ]


_NEXT_SEQ = (
    "INSERT INTO outbox_sequence (aggregate_type, aggregate_id, last_seq) VALUES (:type, :id, 1) "
    "ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = outbox_sequence.last_seq + 1 "
    "RETURNING last_seq")
_INSERT = (
    "INSERT INTO outbox (id, aggregate_type, aggregate_id, seq, event_type, payload, occurred_at) "
    "VALUES (:id, :type, :aggregate_id, :seq, :event_type, CAST(:payload AS jsonb), :occurred_at)")
_DELETE = "DELETE FROM outbox WHERE id = :id"


@dataclass(frozen=True)
class Event:
    id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    seq: int
    event_type: str
    payload: dict[str, Any]
    occurred_at: datetime


def emit(session: Session, aggregate_type: str, aggregate_id: str | int, event_type: str,
         payload: dict[str, Any], occurred_at: datetime | None = None) -> Event:
    """Record one event in the caller's transaction (see the module's steps).

    `payload` is stored as JSON; a Decimal is written as its exact string ("12.50"),
    never a float. `occurred_at` is when the business event happened (event time); it
    defaults to now, in UTC.
    """
    # SQLAlchemy imported here, not with the module: the projections import this module
    # for `topic` and `sequence_table`, and SQLAlchemy is 0.14 s of every command's start.
    from sqlalchemy import text

    if not aggregate_type or "." in aggregate_type:
        raise ValueError(f"aggregate_type must be a non-empty name without dots, not {aggregate_type!r}")
    aggregate_id = str(aggregate_id)
    occurred_at = occurred_at or datetime.now(timezone.utc)
    if occurred_at.tzinfo is None:
        raise ValueError("occurred_at must carry a time zone (UTC is best)")
    seq = session.execute(text(_NEXT_SEQ), {"type": aggregate_type, "id": aggregate_id}).scalar_one()
    event = Event(uuid.uuid4(), aggregate_type, aggregate_id, seq, event_type, payload, occurred_at)
    session.execute(text(_INSERT), {"id": event.id, "type": aggregate_type, "aggregate_id": aggregate_id,
                                    "seq": seq, "event_type": event_type,
                                    "payload": json.dumps(payload, default=_exact), "occurred_at": occurred_at})
    session.execute(text(_DELETE), {"id": event.id})
    return event


def sequence_table(outbox_table: str) -> str:
    """The per-aggregate sequence table beside `outbox_table` (schema.outbox): `ddl` makes both."""
    schema, _, _ = outbox_table.rpartition(".")
    return f"{schema}.outbox_sequence" if schema else "outbox_sequence"


def topic(aggregate_type: str) -> str:
    """The Kafka topic an aggregate type's events are published to."""
    return EVENTS_TOPIC_PREFIX + aggregate_type


def _exact(value: Any) -> str:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
