"""The benchmark's hand-written peer (sync/bench/peer.py), its decode and MERGE core fed
hand-made Debezium records (JSON converter with schemas), read back with deltalake.

No Kafka: apply_records takes what the consumer would hand it, (key, value, offset).
"""

import json
from datetime import datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError
from deltalake import DeltaTable

from sync.bench import peer

NUMERIC = {"__debezium.source.column.type": "NUMERIC", "__debezium.source.column.length": "12",
           "__debezium.source.column.scale": "2"}
FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "string", "optional": True, "field": "price", "parameters": NUMERIC},
    {"type": "int32", "optional": True, "field": "qty"},
    {"type": "boolean", "optional": True, "field": "active"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "seen_at"},
    {"type": "string", "optional": True, "field": "bio"},
]
ROW_SCHEMA = {"type": "struct", "fields": FIELDS, "optional": True}
VALUE_SCHEMA = {"type": "struct", "fields": [{**ROW_SCHEMA, "field": "before"}, {**ROW_SCHEMA, "field": "after"},
                                             {"type": "struct", "field": "source", "fields": []},
                                             {"type": "string", "field": "op"}]}
KEY_SCHEMA = {"type": "struct", "fields": [FIELDS[0]], "optional": False}
SEEN = "2024-03-31T01:30:00.123456Z"


def event(op, key, commit, lsn, name=None, price=None, bio="bio", seen_at=SEEN, offset=0):
    row = {"id": key, "name": name, "price": price, "qty": 3, "active": True, "seen_at": seen_at, "bio": bio}
    before = {"id": key, **{f["field"]: None for f in FIELDS[1:]}} if op == "d" else None
    value = {"schema": VALUE_SCHEMA, "payload": {
        "before": before, "after": None if op == "d" else row, "op": op,
        "source": {"sequence": json.dumps([str(commit) if commit is not None else None, str(lsn)]),
                   "lsn": lsn, "txId": commit or 1, "ts_us": 1711848600123456}}}
    kafka_key = json.dumps({"schema": KEY_SCHEMA, "payload": {"id": key}}).encode()
    return kafka_key, json.dumps(value).encode()


def tombstone(key):
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": key}}).encode(), None


def truncate(commit, lsn):
    value = {"schema": {"type": "struct", "fields": []}, "payload": {
        "before": None, "after": None, "op": "t",
        "source": {"sequence": json.dumps([str(commit), str(lsn)]), "lsn": lsn, "txId": 1, "ts_us": 0}}}
    return b'"lakesync.public.widgets"', json.dumps(value).encode()


def records(events, first_offset=0):
    return [(key, value, first_offset + i) for i, (key, value) in enumerate(events)]


def rows(table_dir):
    table = DeltaTable(str(table_dir)).to_pyarrow_table()
    return {row["id"]: row for row in table.to_pylist()}


@pytest.fixture
def table_dir(tmp_path):
    return tmp_path / "lake" / "widgets"


def test_types_are_exact(table_dir):
    applied = peer.apply_records(records([event("r", 7, None, 5, "snap", "1234567890.12",
                                                seen_at="1969-07-20T20:17:40.000001Z")]), table_dir)
    assert applied == peer.Applied(events=1, merges=1)
    schema = DeltaTable(str(table_dir)).schema().to_arrow()
    types = {field.name: pa.field(field).type for field in schema}
    assert types == {"id": pa.int64(), "name": pa.string(), "price": pa.decimal128(12, 2), "qty": pa.int32(),
                     "active": pa.bool_(), "seen_at": pa.timestamp("us", tz="UTC"), "bio": pa.string(),
                     "_commit_lsn": pa.int64(), "_lsn": pa.int64(), "_op": pa.string()}
    assert rows(table_dir) == {7: {
        "id": 7, "name": "snap", "price": Decimal("1234567890.12"), "qty": 3, "active": True,
        "seen_at": datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=timezone.utc), "bio": "bio",
        "_commit_lsn": 0, "_lsn": 5, "_op": "r"}}


def test_latest_change_per_key_wins_whatever_the_arrival_order(table_dir):
    applied = peer.apply_records(records([
        event("c", 1, None, 10, "snap", "1.00"),
        event("u", 1, 300, 320, "third", "3.00"),
        event("c", 2, 100, 110, "two", "2.00"),
        event("u", 1, 100, 120, "first", "1.50"),
        event("u", 1, 200, 210, "second", "2.00"),
    ]), table_dir)
    assert applied == peer.Applied(events=5, merges=1)
    got = rows(table_dir)
    assert set(got) == {1, 2}
    assert (got[1]["name"], got[1]["price"], got[1]["_commit_lsn"], got[1]["_lsn"], got[1]["_op"]) == \
        ("third", Decimal("3.00"), 300, 320, "u")
    assert (got[2]["name"], got[2]["price"]) == ("two", Decimal("2.00"))


def test_delete_and_tombstone_then_an_older_replay_does_not_win(table_dir):
    peer.apply_records(records([event("c", 1, 10, 11, "a", "1.00"), event("c", 2, 10, 12, "b", "2.00"),
                                event("c", 3, 10, 13, "c", "3.00")]), table_dir)
    applied = peer.apply_records(records([
        event("d", 1, 20, 21), tombstone(1),            # a delete and its tombstone
        event("d", 9, 20, 22), tombstone(9),            # a delete of a key never seen
        event("u", 2, 5, 6, "stale", "0.50"),           # replayed, older than the row
        event("u", 3, 10, 13, "same", "9.99"),          # replayed at the row's own position
        event("c", 4, 30, 31, "new", "4.00"),
    ], 3), table_dir)
    assert applied == peer.Applied(events=5, merges=1)  # tombstones are not change events
    got = rows(table_dir)
    assert set(got) == {2, 3, 4}
    assert [got[k]["name"] for k in (2, 3, 4)] == ["b", "c", "new"]
    assert got[2]["price"] == Decimal("2.00") and (got[2]["_commit_lsn"], got[2]["_lsn"]) == (10, 12)


def test_delete_then_reinsert_in_one_batch(table_dir):
    peer.apply_records(records([event("c", 1, 10, 11, "a", "1.00")]), table_dir)
    peer.apply_records(records([event("c", 1, 30, 31, "again", "1.10"), event("d", 1, 20, 21), tombstone(1)], 1),
                       table_dir)
    got = rows(table_dir)
    assert set(got) == {1} and (got[1]["name"], got[1]["_op"]) == ("again", "c")


def test_an_unsent_toasted_value_keeps_the_earlier_one(table_dir):
    placeholder = peer.PLACEHOLDER
    peer.apply_records(records([event("c", 1, 10, 11, "a", "1.00", bio="long bio 1"),
                                event("c", 2, 10, 12, "b", "2.00", bio="long bio 2")]), table_dir)
    peer.apply_records(records([
        event("u", 1, 20, 21, "a2", "1.00", bio=placeholder),   # from the target row
        event("u", 2, 40, 41, "b3", "2.00", bio=placeholder),   # from the batch's earlier change
        event("u", 2, 30, 31, "b2", "2.00", bio="new bio 2"),
    ], 2), table_dir)
    got = rows(table_dir)
    assert (got[1]["name"], got[1]["bio"]) == ("a2", "long bio 1")
    assert (got[2]["name"], got[2]["bio"]) == ("b3", "new bio 2")


def test_a_value_that_does_not_fit_stops_the_batch(table_dir):
    with pytest.raises(pa.ArrowInvalid):
        peer.apply_records(records([event("c", 1, 10, 11, "a", "1.005")]), table_dir)
    assert not DeltaTable.is_deltatable(str(table_dir))


def test_truncate_removes_older_rows_and_keeps_later_ones(table_dir):
    peer.apply_records(records([event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), table_dir)
    applied = peer.apply_records(records([event("c", 5, 15, 16, "gone"), truncate(20, 21),
                                          event("c", 3, 30, 31, "after")], 2), table_dir)
    assert applied == peer.Applied(events=3, merges=1)
    assert set(rows(table_dir)) == {3}
    assert peer.apply_records(records([truncate(40, 41)], 5), table_dir) == peer.Applied(events=1, merges=0)
    assert rows(table_dir) == {}


def test_only_tombstones_make_no_merge(table_dir):
    assert peer.apply_records(records([tombstone(1)]), table_dir) == peer.Applied(events=0, merges=0)
    assert not DeltaTable.is_deltatable(str(table_dir))


class Message:
    def __init__(self, offset, eof=False, partition=0):
        self._offset, self._eof, self._partition = offset, eof, partition

    def partition(self):
        return self._partition

    def error(self):
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self):
        return self._offset

    def key(self):
        return b"k"

    def value(self):
        return b"v%d" % self._offset


class Consumer:
    """Hands out prepared lists of messages, one list per consume() call."""

    def __init__(self, *polls):
        self.polls, self.assigned = list(polls), None

    def assign(self, partitions):
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in partitions]

    def unassign(self):
        self.assigned = None

    def consume(self, num_messages, timeout):
        return self.polls.pop(0) if self.polls else []


def offsets(batches):
    return [[offset for _, _, offset in batch] for batch in batches]


def test_reading_stops_at_the_end_of_the_range():
    # The range ends on transaction markers (offsets 4, 5 never arrive): end of partition at 6.
    consumer = Consumer([Message(1), Message(2)], [Message(3), Message(6, eof=True)])
    assert offsets(peer._batches(consumer, "t", {0: (1, 6)}, 2)) == [[1, 2], [3]]
    # A record past the range ends it too, and is not taken.
    consumer = Consumer([Message(0), Message(3), Message(7), Message(8)])
    assert offsets(peer._batches(consumer, "t", {0: (0, 5)}, 10)) == [[0, 3]]
    # An end of partition below the end waits for the rest; the last offset ends it at once.
    consumer = Consumer([Message(0), Message(1, eof=True)], [], [Message(1), Message(2)], [Message(3)])
    assert offsets(peer._batches(consumer, "t", {0: (0, 2)}, 10)) == [[0, 1]]
    assert len(consumer.polls) == 1  # not read
    assert list(peer._batches(Consumer(), "t", {0: (4, 4)}, 10)) == []


def test_every_partition_of_a_topic_is_read_to_its_own_end():
    consumer = Consumer([Message(0, partition=1), Message(5, partition=0), Message(1, partition=1)],
                        [Message(2, partition=1), Message(6, partition=0), Message(3, eof=True, partition=1)])
    assert offsets(peer._batches(consumer, "t", {0: (5, 7), 1: (0, 3), 2: (9, 9)}, 10)) == [[0, 5, 1, 2, 6]]
    assert consumer.polls == [] and consumer.assigned is None


def test_a_range_that_never_arrives_fails_instead_of_hanging(monkeypatch):
    monkeypatch.setattr(peer, "STALL_SECONDS", 0)
    with pytest.raises(TimeoutError):
        list(peer._batches(Consumer([Message(0)]), "t", {0: (0, 5)}, 10))
