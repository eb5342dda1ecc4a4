"""Columns renamed or dropped in Postgres, and the names a change event used for them.

Debezium's events name a table's columns as they were when the change was made, so
after `RENAME COLUMN a TO b` a record older than the rename names `b` as `a`, and nothing
in the events tells a rename from a DROP COLUMN a with an ADD COLUMN b. Migration 0009
records each rename and drop, at its source position, in COLUMN_CHANGES_TABLE, whose
topic this module reads (the whole of it: one small record per change, never compacted
away since each has its own key). With that history a consumer decodes any record under
the table's current names (`earlier_names`) and knows which columns a batch of records
ends with (`current_columns`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql import Column
from pyspark.sql import functions as F

from sync.cdc.ordering import Position, parse_sequence
from sync.cdc.types import ColumnType
from sync.config import COLUMN_CHANGES_TABLE, TOPIC_PREFIX, Settings
from sync.errors import ServiceUnavailable

COLUMNS_TOPIC = f"{TOPIC_PREFIX}.{COLUMN_CHANGES_TABLE}"


@dataclass(frozen=True, order=True)
class ColumnChange:
    """One RENAME COLUMN (`new` set) or DROP COLUMN (`new` None) of a table."""

    at: Position
    old: str
    new: str | None


History = dict[tuple[str, str], list[ColumnChange]]  # (schema, table) -> its changes, oldest first


def parse(value: str | bytes | None) -> tuple[tuple[str, str], ColumnChange] | None:
    """The (schema, table) and change of one record of COLUMNS_TOPIC; None for what is not a
    recorded change (a tombstone, a snapshot read: its position is the snapshot's, not
    the change's)."""
    if value is None:
        return None
    payload = json.loads(value).get("payload") or {}
    row, position = payload.get("after"), parse_sequence((payload.get("source") or {}).get("sequence"))
    if payload.get("op") != "c" or row is None or position is None:
        return None
    return (row["schema_name"], row["table_name"]), ColumnChange(position, row["old_name"], row.get("new_name"))


def add(history: History, table: tuple[str, str], change: ColumnChange) -> None:
    """Record one change in `history` (a change seen again, say in the stream after a
    direct read, is kept once)."""
    changes = history.setdefault(table, [])
    if change not in changes:
        changes.append(change)
        changes.sort()


def read_history(settings: Settings, timeout: float = 30.0) -> History:
    """Every change recorded so far, read from Kafka (committed records only, as the
    streaming queries read)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "lakesync-column-changes",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    history: History = {}
    try:
        try:
            metadata = consumer.list_topics(COLUMNS_TOPIC, timeout=timeout).topics.get(COLUMNS_TOPIC)
        except KafkaException as error:
            raise ServiceUnavailable(f"Kafka is unreachable at {settings.kafka_bootstrap} ({error})") from None
        if metadata is None or metadata.error is not None:
            return history  # no column renamed or dropped yet: Debezium creates the topic then
        ends = {p: consumer.get_watermark_offsets(TopicPartition(COLUMNS_TOPIC, p), timeout=timeout)[1]
                for p in metadata.partitions}
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(COLUMNS_TOPIC, p, 0) for p in left])
        while left:
            message = consumer.poll(timeout)
            if message is None:
                raise ServiceUnavailable(f"Kafka did not deliver {COLUMNS_TOPIC} within {timeout:.0f} s")
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(message.partition())
                    continue
                raise ServiceUnavailable(f"reading {COLUMNS_TOPIC}: {message.error()}")
            parsed = parse(message.value())
            if parsed is not None:
                add(history, *parsed)
        return history
    finally:
        consumer.close()


def precedes(commit_lsn: Column, lsn: Column, at: Position) -> Column:
    """Whether a change (its position's columns) was made before a column change at `at`,
    so under the names before it. A snapshot read (no commit LSN: sync/cdc/ordering.py)
    is as of its own LSN."""
    at_commit, at_lsn = at
    return F.when(commit_lsn == 0, lsn < at_lsn).otherwise(
        (commit_lsn < at_commit) | ((commit_lsn == at_commit) & (lsn < at_lsn)))


def _precedes(position: Position, at: Position) -> bool:
    """`precedes` for one position."""
    return position[1] < at[1] if position[0] == 0 else position < at


def until(changes: list[ColumnChange], position: Position) -> list[ColumnChange]:
    """The changes made at or before `position`."""
    return [change for change in changes if not _precedes(position, change.at)]


def earlier_names(name: str, changes: list[ColumnChange]) -> list[tuple[Position, str | None]]:
    """The names column `name` (as it is named after every change in `changes`) had
    before each change that renamed it, newest first: (position, name before it), the
    name None before a position where a column of its name was dropped (an older column,
    not this one)."""
    chain: list[tuple[Position, str | None]] = []
    current = name
    for change in reversed(changes):
        if change.new is not None and change.new == current:
            chain.append((change.at, change.old))
            current = change.old
        elif change.new is None and change.old == current:
            chain.append((change.at, None))
            break
    return chain


def current_names(names: list[str], changes: list[ColumnChange], after: Position | None) -> list[str | None]:
    """`names`, a table's columns as of position `after` (a record's schema), as the
    changes after that position named them (None: dropped)."""
    current: list[str | None] = list(names)
    for change in changes:
        if after is not None and not _precedes(after, change.at):
            continue
        current = [(change.new if name == change.old else name) for name in current]
    return current


def current_columns(columns: list[ColumnType], changes: list[ColumnChange],
                    after: Position | None) -> list[ColumnType]:
    """`current_names` of whole columns, without the dropped ones."""
    names = current_names([c.name for c in columns], changes, after)
    return [replace(c, name=name) for c, name in zip(columns, names) if name is not None]
