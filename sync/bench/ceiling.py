"""The ceiling: Spark reading the same Kafka records and doing nothing else.

A batch read of exactly the offsets the projections read (`ranges`: per topic partition,
[start, end)), every column materialised and dropped by the `noop` sink, so the figure
is what this machine's Spark can pull from this broker; no projection can be faster.
The records are counted in a second, untimed pass: change events (a value) and
tombstones (none).
"""

from __future__ import annotations

import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sync.config import Settings
from sync.streaming.stream import Ranges, read_ranges  # as the projections read


def measure(spark: SparkSession, settings: Settings, ranges: Ranges) -> dict:
    """{"events", "records", "seconds", "events_per_s"} of one pass over `ranges`."""
    ranges = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    if not ranges:
        return {"events": 0, "records": 0, "seconds": 0.0, "events_per_s": None}
    started = time.monotonic()
    read_ranges(spark, settings, ranges, headers=False).write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - started
    counts = (read_ranges(spark, settings, ranges, headers=False)
              .agg(F.count("*").alias("records"), F.count("value").alias("events")).first())
    return {"events": counts["events"], "records": counts["records"], "seconds": round(seconds, 3),
            "events_per_s": round(counts["events"] / seconds) if seconds else None}
