"""The hand-written peer: what a team would write instead of Lakesync.

A plain confluent-kafka consumer and delta-rs MERGE (the `deltalake` package): no Spark,
no JVM, and no Lakesync code. It applies the same Debezium change topics to one Delta
table per source table (lake/<table>), so the benchmark can put Lakesync's apply rate
beside a straightforward alternative's, and check the alternative did the same job.
Per topic, in this order:

1. Assign each of the topic's partitions at its range's start offset (no consumer group,
   nothing committed) and read with isolation.level=read_committed up to the range's end.
   The end is seen as a record at or past end - 1, or as the end of the partition at or
   past end: with exactly-once capture the last offsets of a range are often transaction
   markers, which no consumer ever receives. A key's changes are in one partition.
2. Cut the records into batches of up to `batch_records`; each batch (apply_records):
   a. Decode each record's JSON. Tombstones (null values) carry no change. The row is
      `after`, or `before` for a delete; the position is (commit LSN, change LSN) from
      source.sequence (a null commit LSN, a snapshot read, is 0), then the offset.
   b. Keep the latest change per key by position. The batch is sorted first, so arrival
      order does not matter, and a value Debezium did not send (an unchanged TOASTed
      value, sent as a placeholder) comes from the key's earlier change in the batch.
      Changes older than a truncate in the batch are dropped.
   c. Build a pyarrow table typed from the value schema (numeric(p,s) as decimal(p,s)
      from the propagated column type, timestamptz as UTC microseconds, ...), plus
      _commit_lsn, _lsn and _op. Arrow's casts fail rather than lose digits.
   d. Create the Delta table if it is absent, then ONE MERGE on the key: a newer delete
      deletes, a newer change updates every column (a placeholder keeps the target's
      value), an unseen key is inserted, an older or equal change is ignored.
   e. Only after a truncate (the demo never does one): delete the rows older than it.
3. Stop the clock, then count every table's rows.

What it leaves out, as such a peer would: deletes leave no tombstone, so an older change
of a deleted key replayed in a later batch would bring the key back (one pass in offset
order never does that); no schema evolution (a column added later fails the MERGE); no
dead letters (a value that cannot be stored exactly stops the run).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deltalake import DeltaTable

PLACEHOLDER = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder
STALL_SECONDS = 120  # no record and no end of partition for this long: the range is not there
NEWER = "(s._commit_lsn > t._commit_lsn OR (s._commit_lsn = t._commit_lsn AND s._lsn > t._lsn))"

# Debezium semantic types: (arrow type the JSON value is read as, arrow type stored).
SEMANTIC = {
    "io.debezium.time.ZonedTimestamp": (pa.string(), pa.timestamp("us", tz="UTC")),
    "io.debezium.time.MicroTimestamp": (pa.int64(), pa.timestamp("us")),
    "io.debezium.time.Date": (pa.int32(), pa.date32()),
    "io.debezium.data.Uuid": (pa.string(), pa.string()),
    "io.debezium.data.Json": (pa.string(), pa.string()),
    "io.debezium.data.Enum": (pa.string(), pa.string()),
}
PRIMITIVES = {"boolean": pa.bool_(), "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(),
              "int64": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string()}


class Applied(NamedTuple):
    events: int              # change records in the batch (tombstones not counted)
    merges: int              # 0 or 1


@dataclass
class PeerResult:
    events: int              # change records applied (tombstones not counted)
    seconds: float           # wall time of the whole read and apply
    rows: dict[str, int]     # rows per table after the run
    merges: int              # MERGE calls


def apply_topics(bootstrap: str, ranges: dict[tuple[str, int], tuple[int, int]], lake: Path,
                 batch_records: int = 50_000) -> PeerResult:
    """Read [start, end) of each (topic, partition) and apply each topic to lake/<table>."""
    started = time.monotonic()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lakesync-bench-peer",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         # As Lakesync's reads (sync/streaming/stream.py CONSUMER_OPTIONS): no
                         # half-second wait at a range's closing transaction marker.
                         "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    events = merges = 0
    tables = []
    try:
        by_topic: dict[str, dict[int, tuple[int, int]]] = {}
        for (topic, partition), offsets in ranges.items():
            by_topic.setdefault(topic, {})[partition] = offsets
        for topic, partitions in by_topic.items():
            table_dir = Path(lake) / topic.rsplit(".", 1)[-1]
            for batch in _batches(consumer, topic, partitions, batch_records):
                applied = apply_records(batch, table_dir)
                events, merges = events + applied.events, merges + applied.merges
            if DeltaTable.is_deltatable(str(table_dir)):
                tables.append(table_dir)
    finally:
        consumer.close()
    seconds = time.monotonic() - started
    rows = {d.name: DeltaTable(str(d)).to_pyarrow_table(columns=["_op"]).num_rows for d in tables}
    return PeerResult(events=events, seconds=seconds, rows=rows, merges=merges)


def _batches(consumer: Consumer, topic: str, partitions: dict[int, tuple[int, int]], size: int):
    """Step 1: lists of (key, value, offset) of at most `size` records, covering [start, end)
    of each partition."""
    pending = {p: (start, end) for p, (start, end) in partitions.items() if start < end}
    if not pending:
        return
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in pending.items()])
    batch, heard = [], time.monotonic()
    while pending:
        messages = consumer.consume(num_messages=min(size, 10_000), timeout=1.0)
        if messages:
            heard = time.monotonic()
        elif time.monotonic() - heard > STALL_SECONDS:
            raise TimeoutError(f"{topic}: nothing to read for {STALL_SECONDS} s before the ends {pending}")
        for message in messages:
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(error)
            partition = message.partition()
            if partition not in pending:
                continue  # this partition is done (a later record fetched with the last ones)
            end = pending[partition][1]
            # Past the range (a later record, or the end of a partition that held only
            # transaction markers after our last record): this partition is done.
            if message.offset() >= end:
                del pending[partition]
                continue
            if error is not None:  # end of partition below `end`: the rest is still coming
                continue
            batch.append((message.key(), message.value(), message.offset()))
            if message.offset() == end - 1:
                del pending[partition]
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch
    consumer.unassign()


def apply_records(records: list[tuple[bytes | None, bytes | None, int]], table_dir: Path) -> Applied:
    """Step 2 on one batch of one topic's records (key, value, offset): at most one MERGE
    into the Delta table at `table_dir`, created if absent."""
    changes, truncated, schema, keys = [], None, None, None
    for key, value, offset in records:
        if value is None:
            continue  # tombstone: lets compaction drop the key; its delete came just before
        event = json.loads(value)
        payload = event["payload"]
        position = (*_position(payload["source"].get("sequence"), offset), offset)
        if payload["op"] == "t":  # no row, and its key is the topic's name
            truncated = max(truncated or position, position)
            continue
        if keys is None:
            keys = [f["field"] for f in json.loads(key)["schema"]["fields"]]
        schema = event["schema"]  # the last record's: the table's latest columns
        changes.append((position, payload["op"], payload["before" if payload["op"] == "d" else "after"]))
    events = sum(value is not None for _, value, _ in records)
    latest: dict[tuple, tuple] = {}
    for position, op, row in sorted(changes, key=lambda change: change[0]):
        if truncated is not None and position < truncated:
            continue  # the truncate removed this row after this change
        ident = tuple(row[k] for k in keys)
        earlier = latest.get(ident)
        if op != "d" and earlier is not None and earlier[1] != "d":
            row = {c: earlier[2].get(c) if v == PLACEHOLDER else v for c, v in row.items()}
        latest[ident] = (position, op, row)
    merges = 0
    if latest:
        source = _arrow_table(schema, list(latest.values()))
        _merge(_target(table_dir, source.schema), source, keys)
        merges = 1
    if truncated is not None and DeltaTable.is_deltatable(str(table_dir)):
        # After the MERGE every row it wrote is newer than the truncate: the older ones go.
        commit, lsn, _ = truncated
        DeltaTable(str(table_dir)).delete(f"_commit_lsn < {commit} OR (_commit_lsn = {commit} AND _lsn < {lsn})")
    return Applied(events, merges)


def _position(sequence: str | None, offset: int) -> tuple[int, int]:
    """(commit LSN, change LSN) from source.sequence, the JSON text ["<commit>", "<lsn>"]."""
    try:
        commit, lsn = json.loads(sequence)
        return int(commit or 0), int(lsn)
    except (TypeError, ValueError) as failure:
        raise ValueError(f"offset {offset}: no source position in {sequence!r}") from failure


def _arrow_type(field: dict) -> tuple[pa.DataType, pa.DataType]:
    """(type the JSON value is read as, type stored) of one Debezium field schema."""
    params = field.get("parameters") or {}
    if field.get("name") in SEMANTIC:
        return SEMANTIC[field["name"]]
    if field["type"] == "string" and params.get("__debezium.source.column.type", "").upper() in ("NUMERIC", "DECIMAL"):
        precision = int(params.get("__debezium.source.column.length") or 0)
        scale = int(params.get("__debezium.source.column.scale") or 0)
        if 0 < precision <= 38:  # else unconstrained or too wide for decimal128: refused below
            return pa.string(), pa.decimal128(precision, scale)
    elif field.get("name") is None and field["type"] in PRIMITIVES:
        return PRIMITIVES[field["type"]], PRIMITIVES[field["type"]]
    raise ValueError(f"column {field['field']!r}: the peer does not handle {field.get('name') or field['type']} "
                     f"{params.get('__debezium.source.column.type', '')}")


def _arrow_table(schema: dict, latest: list[tuple]) -> pa.Table:
    """Step 2c: one row per key, typed; a string column may still hold the placeholder."""
    row_fields = next(f for f in schema["fields"] if f["field"] == "after")["fields"]
    columns = {}
    for field in row_fields:
        read_as, stored = _arrow_type(field)
        columns[field["field"]] = pa.array([row.get(field["field"]) for _, _, row in latest], read_as).cast(stored)
    columns["_commit_lsn"] = pa.array([position[0] for position, _, _ in latest], pa.int64())
    columns["_lsn"] = pa.array([position[1] for position, _, _ in latest], pa.int64())
    columns["_op"] = pa.array([op for _, op, _ in latest], pa.string())
    return pa.table(columns)


def _target(table_dir: Path, schema: pa.Schema) -> DeltaTable:
    if DeltaTable.is_deltatable(str(table_dir)):
        return DeltaTable(str(table_dir))
    table_dir.mkdir(parents=True, exist_ok=True)
    return DeltaTable.create(str(table_dir), schema)


def _merge(target: DeltaTable, source: pa.Table, keys: list[str]) -> dict:
    """Step 2d: the one MERGE of a batch. Returns delta-rs' metrics."""
    unsent = {c for c in source.column_names if pa.types.is_string(source.schema.field(c).type)
              and pc.any(pc.equal(source.column(c), PLACEHOLDER)).as_py()}

    def value(column: str, otherwise: str) -> str:
        if column in unsent:  # a value Debezium did not send: keep what is there
            return f"CASE WHEN s.`{column}` = '{PLACEHOLDER}' THEN {otherwise} ELSE s.`{column}` END"
        return f"s.`{column}`"

    columns = source.column_names
    return (target.merge(source, " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys),
                         source_alias="s", target_alias="t")
            .when_matched_delete(f"s._op = 'd' AND {NEWER}")
            .when_matched_update({c: value(c, f"t.`{c}`") for c in columns}, f"s._op <> 'd' AND {NEWER}")
            .when_not_matched_insert({c: value(c, "NULL") for c in columns}, "s._op <> 'd'")
            .execute())
