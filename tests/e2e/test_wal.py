"""Bounded WAL: writes Debezium does not capture must not make the slot keep WAL forever.

A replication slot holds WAL from its restart position on. Debezium moves that position
only when it confirms a change, so a database whose captured tables are idle while
others are busy would keep every byte of WAL. The connector's heartbeat action query
(connectors/postgres-source.json) writes a captured row when the slot holds WAL it has
not confirmed; the second test writes only to an uncaptured table for a minute and
checks that Debezium keeps confirming positions inside it and that the WAL the slot
keeps stays well below what was written. On an idle database it writes the row once a
minute only (the first test): each write is a source transaction, a batch for three of
the runner's queries.
"""

import re
import time
from datetime import datetime, timedelta

import pytest
from confluent_kafka import Consumer, TopicPartition

from sync.config import HEARTBEAT_MAX_AGE_SECONDS, HEARTBEAT_TABLE, HEARTBEAT_WAL_BYTES, SLOT, TOPIC_PREFIX
from sync.stack import capture
from sync.stack.process import wait_until
from sync.streaming.offsets import end_offsets

pytestmark = pytest.mark.e2e

SECONDS = 60
ROWS_PER_ROUND = 1000  # about 1.2 MB of WAL a round, two rounds a second


def _lsn(db) -> int:
    return db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]


def _restart_lsn(db) -> int:
    return db.execute("SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                      (SLOT,)).fetchone()[0]


BEAT_SECONDS = 5  # connectors/postgres-source.json heartbeat.interval.ms


def _beat(db) -> datetime:
    return db.execute(f"SELECT beat_at FROM {HEARTBEAT_TABLE} WHERE id = 1").fetchone()[0]


HEARTBEATS_TOPIC = f"__debezium-heartbeat.{TOPIC_PREFIX}"  # one record a beat, whether or not the row was written


def _wait_for_next_beats(stack, count: int, timeout: float) -> None:
    """Until the connector has sent `count` heartbeats after the topic's end now (records,
    not the commit markers its transactions leave in the topic too)."""
    end = end_offsets(stack, re.escape(HEARTBEATS_TOPIC))[(HEARTBEATS_TOPIC, 0)]
    consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": "lakesync-test-beats",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(HEARTBEATS_TOPIC, 0, end)])
    seen, deadline = 0, time.monotonic() + timeout
    try:
        while seen < count:
            assert time.monotonic() < deadline, f"{seen} of {count} heartbeats in {timeout} s"
            message = consumer.poll(1.0)
            seen += message is not None and message.error() is None
    finally:
        consumer.close()


def test_an_idle_source_gets_a_heartbeat_transaction_once_a_minute(stack, db):
    # A beat a minute old makes the next heartbeat write the row (within one interval,
    # once the slot has confirmed what earlier tests wrote)...
    db.execute(f"UPDATE {HEARTBEAT_TABLE} SET beat_at = now() - interval '{HEARTBEAT_MAX_AGE_SECONDS + 1} seconds' "
               "WHERE id = 1")
    wait_until(lambda: _beat(db) > datetime.now(_beat(db).tzinfo) - timedelta(seconds=BEAT_SECONDS * 3)
               and capture.slot_state(db)["lag_bytes"] < HEARTBEAT_WAL_BYTES, 120, "a heartbeat")
    beat = _beat(db)
    # ...and the beats after it leave the row alone: the connector's next two beats.
    _wait_for_next_beats(stack, 2, 60)
    assert _beat(db) == beat, "the heartbeat wrote its row again on an idle source"


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
