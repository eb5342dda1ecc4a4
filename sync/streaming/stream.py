"""What every Kafka-fed projection's streaming query shares: how it reads, how it runs.

Each projection is one query with its own checkpoint (sync/delta/catalog.py:
<lake>/_checkpoints/<name> at first) and a foreachBatch function (sync/streaming/batch.py)
that commits idempotently (sync/delta/commit.py).
"""

from __future__ import annotations

import json
import time
from typing import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sync.config import Settings
from sync.delta import catalog
from sync.files import read_json, write_json_atomically
from sync.lake import LakePath
from sync.projection import KafkaTopics

# How Spark's Kafka consumers read Connect's topics. Connect writes in transactions
# (exactly-once source): read only what committed. A partition written that way ends in a
# transaction's commit marker, which the consumer never hands out as a record, so the
# fetch that reaches it finds nothing to return and the broker holds it for
# fetch.max.wait.ms (500 ms by default) before answering: half a second per task and batch
# (one record read: 0.63 s, 0.15 s with 10 ms). Spark fetches only offsets it knows are
# written, so the short wait costs nothing elsewhere.
CONSUMER_OPTIONS = {"kafka.isolation.level": "read_committed", "kafka.fetch.max.wait.ms": "10"}

Ranges = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> [first, next) offsets


def read_topics(spark: SparkSession, settings: Settings, topics: KafkaTopics) -> DataFrame:
    """Every topic matching the pattern (new ones too), from offset zero on first start."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
            .option("subscribePattern", topics.pattern)
            .options(**CONSUMER_OPTIONS)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
            .option("includeHeaders", str(topics.headers).lower())
            .load())


def read_ranges(spark: SparkSession, settings: Settings, ranges: Ranges, headers: bool) -> DataFrame:
    """Offset ranges [first, next) of topic partitions, read again as one batch, with the
    columns `read_topics` gives."""
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), (first, after) in ranges.items():
        starting.setdefault(topic, {})[str(partition)] = first
        ending.setdefault(topic, {})[str(partition)] = after
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
            .option("assign", json.dumps({t: sorted(int(p) for p in parts) for t, parts in starting.items()}))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .options(**CONSUMER_OPTIONS)
            .option("includeHeaders", str(headers).lower())
            .load())


def run_batches(records: DataFrame, name: str, apply: Callable[[DataFrame, int], None],
                settings: Settings, once: bool) -> StreamingQuery:
    """Start query `name`: availableNow when `once`, else a processing-time trigger."""
    checkpoint = catalog.checkpoint(settings, name)
    remove_partial_log_writes(checkpoint)
    writer = (records.writeStream.queryName(name)
              .option("checkpointLocation", str(checkpoint))
              .foreachBatch(apply))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{settings.trigger_seconds} seconds")
    return writer.start()


# Replays after lost executors before a query is given up (the runner counts them from its
# last batch done, a rebuild over its run).
EXECUTOR_LOSS_RESTARTS = 5
# What Spark's error says when a batch failed because an executor went away.
_EXECUTOR_LOST = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "ExecutorLostFailure", "FetchFailed",
                  "Executor heartbeat timed out", "Remote RPC client disassociated")


def executor_lost(error) -> str | None:
    """Which of `_EXECUTOR_LOST` a query's error says, if any. On a cluster Spark runs a
    lost executor's tasks again elsewhere, but not a batch whose kept results
    (localCheckpoint) were on it: its query fails, and started again from its checkpoint
    it replays the batch, whose commits are idempotent (the runner and `rebuild` do)."""
    text = str(getattr(error, "desc", None) or error)
    return next((marker for marker in _EXECUTOR_LOST if marker in text), None)


def remove_partial_log_writes(checkpoint: LakePath) -> None:
    """Remove what a killed process left half-written in the checkpoint's offset and
    commit logs: Spark writes each entry to a hidden temporary file (`.<batch>.<uuid>.tmp`,
    with its `.crc`) and renames it into place, so such a file was never an entry and is
    never read. But a query whose first offsets entry was being written when the process
    died finds its offsets directory not empty at batch 0, and Spark 4.2 then refuses to
    start it (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, SPARK-53103) until someone
    deletes them."""
    for log in ("offsets", "commits"):
        for pattern in (".*.tmp", ".*.tmp.crc"):
            for file in (checkpoint / log).glob(pattern):
                file.unlink(missing_ok=True)


# -- after a resnapshot (sync/commands/resnapshot.py), projections start at the new snapshot --

def _resnapshot_file(settings: Settings):
    return settings.lake / "_resnapshot.json"


def note_start_offsets(settings: Settings, offsets: dict[tuple[str, int], int]) -> None:
    """Record (atomically) the topic offsets the last resnapshot's records come after."""
    noted: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in offsets.items():
        noted.setdefault(topic, {})[str(partition)] = offset
    write_json_atomically(_resnapshot_file(settings), {"at": time.time(), "offsets": noted})


def start_offsets(settings: Settings) -> dict[tuple[str, int], int]:
    """The offsets noted by the last resnapshot (empty if there was none)."""
    noted = read_json(_resnapshot_file(settings))
    if not noted:
        return {}
    return {(topic, int(partition)): int(offset)
            for topic, partitions in noted["offsets"].items() for partition, offset in partitions.items()}


def at_or_after(start: dict[tuple[str, int], int], topic: str = "topic", partition: str = "partition",
                offset: str = "offset") -> Column:
    """Predicate on Kafka positions: at or after `start` (a topic not in it: from zero)."""
    if not start:
        return F.lit(True)
    starts = F.create_map(*[part for (t, p), o in start.items() for part in (F.lit(f"{t}#{p}"), F.lit(o))])
    begin = F.element_at(starts, F.concat_ws("#", F.col(topic), F.col(partition).cast("string")))
    return F.col(offset) >= F.coalesce(begin, F.lit(0))
