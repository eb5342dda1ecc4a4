"""The dead-letter table: records a projection could not apply, kept whole, never dropped.

A record lands here when it is not a change event, has no source position, repeats a
position with different content, holds a value its column cannot take exactly, or
belongs to a table whose mirror is stopped (an incompatible schema change). The
projection goes on with everything else; `lakesync status` counts what is here.

Each row keeps the raw Kafka key and value (so the record can be replayed once the
cause is fixed), the error, and where it came from. Writes are appends tagged with
txnAppId `<projection>:dead_letters` and the batch id: a replayed batch adds nothing twice.
"""

from __future__ import annotations

from typing import NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sync.config import Settings
from sync.delta import catalog
from sync.delta.commit import BatchCommit
from sync.delta.merge import ensure_table

SCHEMA = ("projection string, `table` string, topic string, `partition` int, `offset` bigint, "
          "key binary, value binary, error string, batch_id bigint, failed_at timestamp")


def path(settings: Settings, projection: str) -> str:
    """In the projection's generation (sync/delta/catalog.py); generation 0 shares one table."""
    return str(catalog.root(settings, projection) / "dead_letters")


class DeadLetter(NamedTuple):
    """One record set aside: where it is in Kafka, the table it was for, and why."""

    topic: str
    partition: int
    offset: int
    table: str
    error: str


def write(commit: BatchCommit, settings: Settings, records: DataFrame, letters: list[DeadLetter]) -> int:
    """Append the records `letters` name, in the batch's commit (txnAppId
    `<projection>:dead_letters`). `records` is the batch as Kafka gave it (key, value,
    topic, partition, offset). Returns how many rows were written."""
    if not letters:
        return 0
    spark = commit.spark
    named = spark.createDataFrame(letters, "topic string, `partition` int, `offset` bigint, "
                                           "`table` string, error string")
    rows = (records.select("key", "value", "topic", "partition", "offset")
            .join(named, ["topic", "partition", "offset"])
            .select(F.lit(commit.projection).alias("projection"), "table", "topic", "partition", "offset",
                    "key", "value", "error", F.lit(commit.batch_id).cast("bigint").alias("batch_id"),
                    F.current_timestamp().alias("failed_at")))
    target = path(settings, commit.projection)
    ensure_table(spark, target, SCHEMA, {"delta.appendOnly": "true"})
    commit.append(rows, target, "dead_letters")
    return len(letters)
