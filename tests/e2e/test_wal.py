"""Bounded WAL: writes Debezium does not capture must not make the slot keep WAL forever.

A replication slot holds WAL from its restart position on. Debezium moves that position
only when it confirms a change, so a database whose captured tables are idle while
others are busy would keep every byte of WAL. The connector's heartbeat action query
(connectors/postgres-source.json) writes a captured row every few seconds; this test
writes only to an uncaptured table for a minute and checks that Debezium keeps
confirming positions inside it and that the WAL the slot keeps stays well below what
was written.
"""

import time

import pytest

from sync.config import SLOT
from sync.stack import capture

pytestmark = pytest.mark.e2e

SECONDS = 60
ROWS_PER_ROUND = 1000  # about 1.2 MB of WAL a round, two rounds a second


def _lsn(db) -> int:
    return db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]


def _restart_lsn(db) -> int:
    return db.execute("SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                      (SLOT,)).fetchone()[0]


def test_uncaptured_writes_keep_the_slot_wal_bounded(db, app_db, synced):
    db.execute("CREATE SCHEMA IF NOT EXISTS uncaptured")
    db.execute("CREATE TABLE IF NOT EXISTS uncaptured.filler (id bigserial PRIMARY KEY, payload text)")
    started_at, restart_at = _lsn(db), _restart_lsn(db)
    kept, unconfirmed = [], []
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        db.execute("INSERT INTO uncaptured.filler (payload) SELECT repeat(md5(g::text), 32) "
                   "FROM generate_series(1, %s) g", (ROWS_PER_ROUND,))
        slot = capture.slot_state(db)
        kept.append(slot["retained_bytes"])
        unconfirmed.append(slot["lag_bytes"])
        time.sleep(0.5)  # the pace of the writer, not a wait for a result
    written = _lsn(db) - started_at
    print(f"WAL written {written} bytes in {SECONDS} s; the slot kept at most {max(kept)} "
          f"(at the end {kept[-1]}), unconfirmed at the end {unconfirmed[-1]}")
    assert written > 50 * 2**20, f"only {written} bytes of WAL written"
    # Heartbeats: Debezium confirms positions inside the burst every few seconds.
    assert unconfirmed[-1] < written / 3, f"{unconfirmed[-1]} of {written} bytes unconfirmed"
    # And the slot lets WAL go: its restart position moves on, at Postgres' running-xacts
    # records (every 15 s), so it keeps tens of seconds of WAL, not the whole burst.
    released = _restart_lsn(db) - restart_at
    assert released > written / 3, f"the slot released {released} of {written} bytes written"
    # And capture still works, to the end: a captured change arrives and matches Postgres.
    app_db.execute("INSERT INTO customers (id, name) VALUES (5100, 'after the filler') ON CONFLICT DO NOTHING")
    synced("customers")
