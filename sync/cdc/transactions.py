"""Whole source transactions: which changes a batch may apply, and which it must hold.

Debezium (`provide.transaction.metadata`) writes a BEGIN and an END record per Postgres
transaction to TRANSACTIONS_TOPIC (one partition, in commit order: the order of the
changes across the partitions of their topics, LAKESYNC_TOPIC_PARTITIONS), and gives every
change it streams a `transaction` block whose id is "<xid>:<the change's LSN>". END
names, per table, how many change events the transaction has. A snapshot read carries no
transaction block.

A Kafka batch can end inside a source transaction: Connect commits a Kafka transaction
per poll, not per Postgres transaction, and END may arrive in a batch before or after
some of its changes. So a projection that must never show half a transaction (the
mirrors) decides per batch, with `settle`:
  1. Its ENDs in commit order, those the previous batch held first; a transaction is
     complete when every table it changed that the projection reads has all its change
     events in the held or the new records.
  2. The complete transactions up to the first incomplete one are applied (so every
     commit reflects a prefix of the source's transactions); every later transaction,
     and every transaction whose END has not arrived, is held.
  3. What is held is written down per batch (`Held`, a small JSON file): the ENDs not yet
     applied, the held transactions' ids, and per topic partition the range of offsets
     their changes lie in. The next batch reads those ranges again (Kafka keeps every
     record for a day: the topics' min.compaction.lag.ms) and keeps only the held
     transactions' changes.
A replayed batch holds what it decided the first time (its own file, kept): where a
batch stops can depend on the moment (`lakesync run --once`, batches aligned across
projections: sync/delta/points.py), and its commits before a crash hold just that. A change
Kafka holds twice (a record produced again) whose transaction was applied before applies
again, idempotently, and its END again is ignored: a change's source.sequence starts
with the commit LSN of the transaction before its own (none for the first transaction a
new slot streams: its own LSN, written before its commit, places it), END's id ends with
its own, so both are placed against the last transaction applied (`Held.through`).

Which records count toward END, and how a record names its transaction, is the
projection's `Rule`: the mirrors (and the changelog, which reads their topics) count each
table topic's change events; the ledger counts the outbox events of every aggregate type
against END's count of the outbox's sequence table (sync/outbox.py: one sequence change
per event emitted).
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sync.cdc.ordering import position_columns
from sync.config import COMPACTION_LAG_MS, TOPIC_PREFIX
from sync.files import write_json_atomically
from sync.lake import LakePath
from sync.streaming.spark import in_task_slots, one_of
from sync.streaming.stream import Ranges

TRANSACTIONS_TOPIC = f"{TOPIC_PREFIX}.transaction"
XID = "_lakesync_xid"  # a record's source transaction (null: a snapshot read, or no metadata)
END = "_lakesync_end"  # an END record's value (null for every other record)
# Per-batch files kept: as many as Spark keeps of the query's own offsets log
# (spark.sql.streaming.minBatchesToRetain, 100), so what a batch held is known as long as
# what it read (status, `wait` and a replay read the last batches' own).
KEPT_FILES = 100


def with_boundaries(pattern: str) -> str:
    """A topic pattern (a Java regex) widened to TRANSACTIONS_TOPIC: what a query that holds
    incomplete source transactions reads."""
    return f"(?:{pattern}|{re.escape(TRANSACTIONS_TOPIC)})"


def xid(value: Column) -> Column:
    """The source transaction of a change record (its Kafka value, JSON with schema)."""
    return xid_of(value.cast("string"), "$.payload.transaction.id")


def xid_of(text: Column, path: str) -> Column:
    """The transaction of Debezium's transaction id ("<xid>:<LSN>") at JSON `path` of `text`."""
    return xid_of_id(F.get_json_object(text, path))


def xid_of_id(transaction_id: Column) -> Column:
    """The transaction of Debezium's transaction id "<xid>:<LSN>"."""
    return F.substring_index(transaction_id, ":", 1)


def is_end(value: Column) -> Column:
    return F.get_json_object(value.cast("string"), "$.payload.status") == "END"


@dataclass(frozen=True)
class Rule:
    """How a projection's records belong to source transactions, and what END counts of them."""

    counted: Callable[[str], bool]       # the topics (END's tables, as topics) whose counts matter
    xid: Callable[[], Column]            # a change record's transaction, over the records' columns
    sequence: Callable[[], Column]       # its Debezium source.sequence (sync/cdc/ordering.py)
    count_as: Callable[[str], str] = lambda topic: topic  # the counted topic a record's topic counts toward
    compacted: bool = True               # its topics are compacted: fewer changes than END counts may be all


def changes(counted: Callable[[str], bool]) -> Rule:
    """The rule for change events of the table topics (the mirrors)."""
    return Rule(counted, lambda: xid(F.col("value")),
                lambda: F.get_json_object(F.col("value").cast("string"), "$.payload.source.sequence"))


@dataclass(frozen=True)
class End:
    offset: int              # in TRANSACTIONS_TOPIC: commit order
    counts: dict[str, int]   # per topic read: the transaction's change events in it
    lsn: int = 0             # its commit's LSN (Debezium's id is "<xid>:<lsn>")
    ts_ms: int = 0           # its commit time, ms since the epoch


@dataclass
class Held:
    """What one batch left for the next (see the module docstring, step 3), and the last
    source transaction applied so far (`through`: where every table stands)."""

    ends: dict[str, End] = field(default_factory=dict)
    xids: set[str] = field(default_factory=set)
    ranges: Ranges = field(default_factory=dict)
    through: End | None = None
    first: int | None = None  # commit order (END offset) of the first transaction this batch applied that counts
    # The batch stopped where the projections it follows stand (`align`), before the last
    # whole transaction it read: no record may come to start the batch that applies the rest.
    stopped_short: bool = False

    def to_json(self) -> dict:
        return {"ends": {x: asdict(e) for x, e in self.ends.items()},
                "xids": sorted(self.xids),
                "ranges": [[t, p, first, after] for (t, p), (first, after) in sorted(self.ranges.items())],
                "through": asdict(self.through) if self.through else None, "first": self.first,
                "stopped_short": self.stopped_short}

    @staticmethod
    def from_json(data: dict) -> "Held":
        return Held(ends={x: End(**e) for x, e in data["ends"].items()},
                    xids=set(data["xids"]),
                    ranges={(t, p): (first, after) for t, p, first, after in data["ranges"]},
                    through=End(**data["through"]) if data.get("through") else None, first=data.get("first"),
                    stopped_short=data.get("stopped_short", False))

    def oldest(self) -> str | None:
        """The held transaction first in commit order (one whose END came, else any)."""
        if self.ends:
            return min(self.ends, key=lambda x: self.ends[x].offset)
        return min(self.xids, default=None)


def end_of(offset: int, value: str, reads: Callable[[str], bool]) -> tuple[str, End]:
    """(xid, End) of one END record's value; only the tables whose topics are read count."""
    payload = json.loads(value)["payload"]
    counts = {}
    for collection in payload.get("data_collections") or []:
        topic = f"{TOPIC_PREFIX}.{collection['data_collection']}"
        if reads(topic) and collection["event_count"]:
            counts[topic] = int(collection["event_count"])
    xid, _, lsn = payload["id"].partition(":")
    return xid, End(offset, counts, int(lsn or 0), int(payload.get("ts_ms") or 0))


@dataclass(frozen=True)
class Seen:
    """A batch's changes of one transaction in one topic partition."""

    xid: str
    topic: str
    partition: int
    count: int
    first: int
    last: int


class Partitions(Protocol):
    """The partitions of the topics a batch reads, as its offsets log and Kafka see them
    (sync/streaming/offsets.py `BatchPartitions`)."""

    def of(self, topic: str) -> list[int]:
        """The topic's partitions (those the batch read)."""

    def drained(self, topic: str, partition: int) -> bool:
        """The batch read everything the partition holds: Kafka's end is the batch's."""


class OnePartition:
    """Every topic in one partition (what a test of one-partition topics gives `settle`)."""

    def of(self, topic: str) -> list[int]:
        return [0]

    def drained(self, topic: str, partition: int) -> bool:
        return False


def settle(previous: Held, ends: Iterable[tuple[str, End]], seen: Iterable[Seen], rule: Rule | None = None,
           until: int | None = None, partitions: Partitions = OnePartition(), now_ms: int | None = None) -> Held:
    """Steps 1-3 of the module docstring: what this batch holds. `seen` covers the held
    changes read again and the batch's own; every change not of a held transaction applies.
    `until`: a transaction whose END is at or after this offset is held, whole or not
    (`lakesync run --once`: every projection stops at the same transaction). `partitions`:
    how the topics are partitioned, asked only of a transaction with fewer changes than
    END counts (`superseded`); `now_ms`: the time it is asked at (now if None)."""
    # An END at or before the last one applied is of a transaction applied before, again.
    all_ends = {**previous.ends, **{x: e for x, e in ends
                                    if previous.through is None or e.lsn > previous.through.lsn}}
    seen = list(seen)
    count_as, compacted = (rule.count_as, rule.compacted) if rule else ((lambda topic: topic), True)
    counted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    in_partition: dict[tuple[str, int], set[str]] = defaultdict(set)
    for part in seen:
        counted[part.xid][count_as(part.topic)] += part.count
        in_partition[(part.topic, part.partition)].add(part.xid)

    def later(y: str, than: End) -> bool:  # an END not read yet comes after every END read
        return y not in all_ends or all_ends[y].offset > than.offset

    def superseded(x: str, end: End, topic: str) -> bool:
        """Fewer of x's changes in `topic` than END counts, and the missing ones can only
        have been compacted away (superseded by a later change of their key, as in a rebuild
        from offset zero), not be still to come. A partition is in commit order, so in one
        where a later transaction's change is here, every change of x is here too. A topic
        of one partition: that is all. Of several: each partition must have one, or, where
        x is older than Kafka's compaction lag (so all of it was written long ago), have
        been read to its end."""
        ahead = {p: any(later(y, end) for y in in_partition[(topic, p)] if y != x) for p in partitions.of(topic)}
        if len(ahead) <= 1:
            return any(ahead.values())
        old = (time.time() * 1000 if now_ms is None else now_ms) - end.ts_ms >= COMPACTION_LAG_MS
        return all(found or old and partitions.drained(topic, p) for p, found in ahead.items())

    def complete(x: str) -> bool:
        """Every change of x in each topic is here: as many as END counts, or fewer where
        the missing ones were compacted away (`superseded`)."""
        end = all_ends[x]
        return all(counted[x][topic] >= n or compacted and superseded(x, end, topic)
                   for topic, n in end.counts.items())

    held: set[str] = set()
    for x in sorted(all_ends, key=lambda x: all_ends[x].offset):
        if held or not complete(x) or until is not None and all_ends[x].offset >= until:
            held.add(x)
    held |= {part.xid for part in seen if part.xid not in all_ends}
    ranges: Ranges = {}
    for part in seen:
        if part.xid in held:
            first, after = ranges.get((part.topic, part.partition), (part.first, part.last + 1))
            ranges[(part.topic, part.partition)] = (min(first, part.first), max(after, part.last + 1))
    applied = [all_ends[x] for x in all_ends if x not in held]
    through = max(applied, key=lambda e: e.offset, default=previous.through)
    first = min((e.offset for e in applied if e.counts), default=None)
    return Held(ends={x: e for x, e in all_ends.items() if x in held}, xids=held, ranges=ranges, through=through,
                first=first)


# -- the per-batch files, in <checkpoint>/transactions ------------------------------------

def _folder(checkpoint: LakePath) -> LakePath:
    return checkpoint / "transactions"


def _batches(checkpoint: LakePath) -> list[int]:
    folder = _folder(checkpoint)
    return sorted(int(p.stem) for p in folder.glob("[0-9]*.json")) if folder.is_dir() else []


def held_before(checkpoint: LakePath, batch_id: int) -> Held:
    """What the batch before `batch_id` held (nothing before the first)."""
    earlier = [b for b in _batches(checkpoint) if b < batch_id]
    if not earlier:
        return Held()
    return Held.from_json(json.loads((_folder(checkpoint) / f"{earlier[-1]}.json").read_text()))


def write_held(checkpoint: LakePath, batch_id: int, held: Held) -> None:
    write_json_atomically(_folder(checkpoint) / f"{batch_id}.json", held.to_json())
    for old in _batches(checkpoint)[:-KEPT_FILES]:
        (_folder(checkpoint) / f"{old}.json").unlink(missing_ok=True)


def decided(checkpoint: LakePath) -> tuple[int, Held] | None:
    """The last batch that has decided what it holds (its commits may not be done), and
    that decision: where its projection will stand once they are."""
    batches = _batches(checkpoint)
    return (batches[-1], held_after(checkpoint, batches[-1])) if batches else None


def held_after(checkpoint: LakePath, batch_id: int) -> Held:
    """What batch `batch_id` held (nothing if it wrote no file: a query without the gate)."""
    path = _folder(checkpoint) / f"{batch_id}.json"
    return Held.from_json(json.loads(path.read_text())) if path.is_file() else Held()


def gate(records: DataFrame, batch_id: int, checkpoint: LakePath, rule: Rule,
         read_again: Callable[[SparkSession, Ranges], DataFrame], partitions: Partitions, whole: bool = True,
         keep: Callable[[DataFrame], DataFrame] | None = None, until: int | None = None,
         align: Callable[[int | None, int], int | None] | None = None) -> tuple[DataFrame, Held]:
    """A batch's Kafka records (TRANSACTIONS_TOPIC's among them) -> the changes it may
    apply, checkpointed, and what it holds (written down before anything is applied).
    `read_again` reads offset ranges of the topics, with the records' columns;
    `partitions`: how they are partitioned (see `settle`). Not
    `whole` (the setting off): every change applies, those held before too. `keep`: what
    of the records is checkpointed and returned (it keeps topic, partition, offset and
    the gate's own two columns); all of their columns if None. `until`: see `settle`.
    `align(previous place, place)`: where the batch stops instead, at or before the place
    (commit order) it would apply through, so as to stand with other projections
    (sync/delta/points.py `follow`); None: there."""
    previous = held_before(checkpoint, batch_id)
    # A transaction record is kept as its END alone (`_lakesync_end`), its key and value
    # emptied: the caller's filters run over these rows, Spark may evaluate them before
    # the one dropping such records, and they are written for change events.
    boundary = F.col("topic") == TRANSACTIONS_TOPIC
    transaction = rule.xid() if whole else F.lit(None).cast("string")
    if previous.through is not None:  # a change of a transaction applied before, again
        # Told by the commit before it; or, where the change's sequence has none (the first
        # transaction a new slot streams: read as 0), by its own LSN. A change is written
        # before its commit, so either at or past `through`'s commit is of a later one.
        transaction = F.when(F.greatest(*position_columns(rule.sequence())) >= previous.through.lsn, transaction)
    marked = records.select(
        *[F.when(~boundary, F.col(c)).alias(c) if c in ("key", "value", "headers") else c for c in records.columns],
        transaction.alias(XID), F.when(boundary & is_end(F.col("value")), F.col("value").cast("string")).alias(END))
    if previous.ranges:
        again = read_again(records.sparkSession, previous.ranges).where(F.col("value").isNotNull())
        again = again.withColumn(XID, rule.xid()).withColumn(END, F.lit(None).cast("string"))
        marked = marked.unionByName(again.where(one_of(XID, sorted(previous.xids))).select(*marked.columns))
    # In as many partitions as there are task slots: every later pass over the batch's
    # records (its plan, each table's decode and screening, the changelog's parse) runs
    # a task per partition, and a Kafka batch has one per topic partition.
    marked = in_task_slots(keep(marked) if keep else marked).localCheckpoint(eager=True)
    held = Held(through=previous.through)
    if whole and (_folder(checkpoint) / f"{batch_id}.json").is_file():
        # A replay holds what the batch decided the first time: where it stopped may have
        # depended on the moment (`until`, `align`), and commits made before a crash hold that.
        held = held_after(checkpoint, batch_id)
    else:
        if whole:
            held = _decide(marked, previous, rule, until, align, partitions)
        write_held(checkpoint, batch_id, held)
    applicable = ~one_of(XID, sorted(held.xids)) if held.xids else F.lit(True)
    return marked.where(~boundary & (F.col(XID).isNull() | applicable)).drop(XID, END), held


def _decide(marked: DataFrame, previous: Held, rule: Rule, until: int | None,
            align: Callable[[int | None, int], int | None] | None, partitions: Partitions) -> Held:
    """What a batch holds (`settle`), stopping where `align` says (see `gate`)."""
    # One aggregate for both. A boundary record has no transaction of its own (every rule's
    # xid is null there), so a group is an END alone or one transaction's changes in a
    # topic partition.
    groups = (marked.where(F.col(XID).isNotNull() | F.col(END).isNotNull())
              .groupBy(XID, "topic", "partition", END)
              .agg(F.count("*").alias("count"), F.min("offset").alias("first"), F.max("offset").alias("last"))
              .collect())
    ends = [end_of(row["last"], row[END], rule.counted) for row in groups if row[END] is not None]
    seen = [Seen(row[XID], row["topic"], row["partition"], row["count"], row["first"], row["last"])
            for row in groups if row[XID] is not None]
    held = settle(previous, ends, seen, rule, until, partitions)
    after = previous.through.offset if previous.through else None
    if align and held.through is not None and held.through.offset != after:
        cut = align(after, held.through.offset)
        if cut is not None and cut < held.through.offset:
            held = settle(previous, ends, seen, rule, cut + 1 if until is None else min(until, cut + 1), partitions)
            held.stopped_short = True
    return held
