"""Bounded WAL: writes Debezium does not capture must not make the slot keep WAL forever.

A replication slot holds WAL from its restart position on. Debezium moves that position
only when it confirms a change, so a database whose captured tables are idle while
others are busy would keep every byte of WAL. The connector's heartbeat action query
(connectors/postgres-source.json) writes a captured row every few seconds; this test
writes only to an uncaptured table for a while and checks the WAL kept stays a small
part of what was written.
"""

import time

import pytest

from sync import capture

pytestmark = pytest.mark.e2e

SECONDS = 60
ROWS_PER_ROUND = 1000  # about 1.2 MB of WAL a round, two rounds a second


def _lsn(db) -> int:
    return db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]


def test_uncaptured_writes_keep_the_slot_wal_bounded(db, app_db, synced):
    db.execute("CREATE SCHEMA IF NOT EXISTS uncaptured")
    db.execute("CREATE TABLE IF NOT EXISTS uncaptured.filler (id bigserial PRIMARY KEY, payload text)")
    started_at = _lsn(db)
    kept = []
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        db.execute("INSERT INTO uncaptured.filler (payload) SELECT repeat(md5(g::text), 32) "
                   "FROM generate_series(1, %s) g", (ROWS_PER_ROUND,))
        kept.append(capture.slot_state(db)["retained_bytes"])
        time.sleep(0.5)  # the pace of the writer, not a wait for a result
    written = _lsn(db) - started_at
    print(f"WAL written {written} bytes in {SECONDS} s; the slot kept at most {max(kept)}, at the end {kept[-1]}")
    assert written > 50 * 2**20, f"only {written} bytes of WAL written"
    # Without heartbeats the slot would keep all of it; with them, a few seconds' worth.
    assert max(kept) < written / 2, f"the slot kept up to {max(kept)} of {written} bytes written"
    assert kept[-1] < written / 2
    # And capture still works, to the end: a captured change arrives and matches Postgres.
    app_db.execute("INSERT INTO customers (id, name) VALUES (5100, 'after the filler') ON CONFLICT DO NOTHING")
    synced("customers")
