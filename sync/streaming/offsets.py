"""Where a streaming query stands: what its inputs hold and what its checkpoint has read.

Kafka-fed queries are measured in offsets per topic partition, Delta-fed ones in
versions per input table (as partition 0). The freshness barrier, `status`, the
metrics sampler and `rebuild` all measure through here.
"""

from __future__ import annotations

import json
import re

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from sync import lake
from sync.cdc.transactions import held_after
from sync.config import Settings
from sync.delta import catalog, points
from sync.errors import ServiceUnavailable
from sync.lake import LakePath
from sync.projection import KafkaTopics, Projection

Offsets = dict[tuple[str, int], int]  # (topic, partition) -> next offset


def end_offsets(settings: Settings, pattern: str) -> Offsets:
    regex = re.compile(pattern)
    try:
        metadata = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=10)
    except Exception as error:  # librdkafka raises KafkaException with a long text
        raise ServiceUnavailable(f"Kafka is unreachable at {settings.kafka_bootstrap} ({error})") from None
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "lakesync-freshness",
                         "enable.auto.commit": False})
    try:
        ends: Offsets = {}
        for topic, meta in metadata.topics.items():
            if not regex.fullmatch(topic):
                continue
            for partition in meta.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                ends[(topic, partition)] = high
        return ends
    finally:
        consumer.close()


def last_batch(checkpoint: LakePath) -> int | None:
    """The id of the last batch the query committed (None before its first)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.is_dir() else []
    return max(commits, default=None)


def _source_offsets(checkpoint: LakePath, batch: int) -> list[str]:
    """Batch `batch`'s end offset of each of the query's sources, in their order (the
    offsets log's lines after its version and its metadata)."""
    return (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2:]


def batch_ends(checkpoint: LakePath, batch: int) -> Offsets:
    """Where a Kafka-fed query's batch `batch` ends: what it has read, per topic partition."""
    ends: Offsets = {}
    for line in _source_offsets(checkpoint, batch):
        for topic, partitions in json.loads(line).items():
            for partition, offset in partitions.items():
                ends[(topic, int(partition))] = int(offset)
    return ends


class BatchPartitions:
    """The partitions of the topics batch `batch` of a Kafka-fed query reads, from its
    offsets log (written before the batch runs), and whether it read each to Kafka's end
    (asked of Kafka at most once per topic): sync/cdc/transactions.py `Partitions`."""

    def __init__(self, settings: Settings, checkpoint: LakePath, batch: int):
        self.settings, self.checkpoint, self.batch = settings, checkpoint, batch
        self._ends: Offsets | None = None
        self._kafka_ends: dict[str, Offsets] = {}

    def _batch_ends(self) -> Offsets:
        if self._ends is None:
            logged = self.checkpoint / "offsets" / str(self.batch)
            self._ends = batch_ends(self.checkpoint, self.batch) if logged.is_file() else {}
        return self._ends

    def of(self, topic: str) -> list[int]:
        return sorted(p for t, p in self._batch_ends() if t == topic) or [0]

    def records(self) -> int | None:
        """The offsets the batch spans, over every partition: from where the batch before it
        ended (its offsets log, kept for the last 100 batches), or from 0 for a partition it
        did not read (a first batch; a topic's offsets start at 0 until retention deletes
        some). Records compacted away count: an estimate of the batch's size, no Spark job.
        None without the batch's offsets log (a batch function called outside a query)."""
        ends = self._batch_ends()
        if not ends:
            return None
        try:  # (read without asking first: on a bucket one request, not two)
            starts = batch_ends(self.checkpoint, self.batch - 1) if self.batch > 0 else {}
        except FileNotFoundError:
            starts = {}
        return sum(max(0, end - starts.get(part, 0)) for part, end in ends.items())

    def drained(self, topic: str, partition: int) -> bool:
        if topic not in self._kafka_ends:
            self._kafka_ends[topic] = end_offsets(self.settings, re.escape(topic))
        read = self._batch_ends().get((topic, partition))
        return read is not None and self._kafka_ends[topic].get((topic, partition)) == read


def processed_offsets(checkpoint: LakePath) -> Offsets:
    """The end offsets of the last batch the query committed (from its checkpoint), or
    where the changes it holds start (sync/cdc/transactions.py): those are not applied."""
    last = last_batch(checkpoint)
    if last is None:
        return {}
    done = batch_ends(checkpoint, last)
    for part, (first, _) in held_after(checkpoint, last).ranges.items():
        done[part] = min(done.get(part, first), first)
    return done


def latest_version(table: str) -> int:
    """The latest version of a Delta table, from its log's file names (-1: no table)."""
    log = lake.at(table) / "_delta_log"
    return max((int(p.stem) for p in log.glob("[0-9]*.json")), default=-1)


def processed_versions(checkpoint: LakePath, tables: list[str]) -> Offsets:
    """For a query streaming from Delta tables (its sources in `tables` order): the next
    version of each table it will read, from its last committed batch. Delta's offset
    (v, index -1) means every version before v has been read."""
    last = last_batch(checkpoint)
    if last is None:
        return {}
    lines = (checkpoint / "offsets" / str(last)).read_text().splitlines()[2:]
    done: Offsets = {}
    for table, line in zip(tables, lines):
        # (v, index i >= 0) means version v is read up to its file i: v is not done either.
        offset = json.loads(line) if line.strip() not in ("", "-") else {}
        done[(table, 0)] = int(offset.get("reservoirVersion", 0))
    return done


def whole_versions_read(checkpoint: LakePath, batch: int, tables: dict[str, str]) -> dict[str, dict] | None:
    """For a query streaming from Delta tables (`tables`: name -> path, in the order of
    its sources): per table, its path and the last version batch `batch` has read whole,
    counting the batches before it (-1: none yet); None if the batch ends inside a
    version (a trigger's file limit) or in a table's first snapshot. A batch's offsets
    are written before it runs."""
    lines = _source_offsets(checkpoint, batch)
    if len(lines) < len(tables):
        return None
    read = {}
    for (name, path), line in zip(tables.items(), lines):
        offset = json.loads(line) if line.strip() not in ("", "-") else {}
        if offset.get("index") != -1 or offset.get("isStartingVersion"):
            return None
        read[name] = {"path": path, "version": int(offset["reservoirVersion"]) - 1}
    return read


def input_ends(settings: Settings, projection: Projection) -> Offsets:
    """What a projection has to read: per Kafka topic partition the next offset, or per
    input Delta table (as partition 0) the next version."""
    source = projection.source(settings)
    if isinstance(source, KafkaTopics):
        return end_offsets(settings, source.pattern)
    return {(t, 0): latest_version(t) + 1 for t in source.paths if latest_version(t) >= 0}


def processed(settings: Settings, projection: Projection) -> Offsets:
    """What its last committed batch has read, in the same terms as `input_ends`."""
    checkpoint = catalog.checkpoint(settings, projection.name)
    source = projection.source(settings)
    if isinstance(source, KafkaTopics):
        return processed_offsets(checkpoint)
    done = processed_versions(checkpoint, list(source.paths))
    # A derived batch that stopped at a place before its stream's end applied its
    # inputs only so far (projections/derived.py `Reading.applied`): the rest is held.
    last = last_batch(checkpoint)
    decided = points.decision(catalog.root(settings, projection.name), projection.name, last) if last is not None \
        else None
    for path, version in ((decided or {}).get("applied") or {}).items():
        if (path, 0) in done:
            done[(path, 0)] = min(done[(path, 0)], version + 1)
    return done
