"""The ceiling: Spark reading the same Kafka records and doing nothing else.

A batch read of exactly the offsets the projections read (`ranges`: per topic partition,
[start, end)), every column materialised and dropped by the `noop` sink, so the figure
is what this machine's Spark can pull from this broker; no projection can be faster.
The records are counted in a second, untimed pass: change events (a value) and
tombstones (none).
"""

from __future__ import annotations

import json
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sync.config import Settings
from sync.streaming.stream import CONSUMER_OPTIONS

Ranges = dict[tuple[str, int], tuple[int, int]]


def read(spark: SparkSession, settings: Settings, ranges: Ranges):
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for (topic, partition), (start, end) in ranges.items():
        starts.setdefault(topic, {})[str(partition)] = start
        ends.setdefault(topic, {})[str(partition)] = end
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
            .option("assign", json.dumps({t: [int(p) for p in ps] for t, ps in starts.items()}))
            .option("startingOffsets", json.dumps(starts))
            .option("endingOffsets", json.dumps(ends))
            .options(**CONSUMER_OPTIONS)  # as the projections read
            .load())


def measure(spark: SparkSession, settings: Settings, ranges: Ranges) -> dict:
    """{"events", "records", "seconds", "events_per_s"} of one pass over `ranges`."""
    ranges = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    if not ranges:
        return {"events": 0, "records": 0, "seconds": 0.0, "events_per_s": None}
    started = time.monotonic()
    read(spark, settings, ranges).write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - started
    counts = read(spark, settings, ranges).agg(F.count("*").alias("records"),
                                               F.count("value").alias("events")).first()
    return {"events": counts["events"], "records": counts["records"], "seconds": round(seconds, 3),
            "events_per_s": round(counts["events"] / seconds) if seconds else None}
