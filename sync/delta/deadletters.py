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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sync.delta import catalog
from sync.config import Settings
from sync.delta.commit import Fence, commit_batch
from sync.delta.merge import ensure_table

SCHEMA = ("projection string, `table` string, topic string, `partition` int, `offset` bigint, "
          "key binary, value binary, error string, batch_id bigint, failed_at timestamp")


def path(settings: Settings, projection: str) -> str:
    """In the projection's generation (sync/delta/catalog.py); generation 0 shares one table."""
    return str(catalog.root(settings, projection) / "dead_letters")


def write(spark: SparkSession, settings: Settings, projection: str, batch_id: int,
          records: DataFrame, errors: list[tuple[str, int, int, str, str]], fence: Fence) -> int:
    """Append the records named in `errors` as (topic, partition, offset, table, error).

    `records` is the batch as Kafka gave it (key, value, topic, partition, offset).
    Returns how many rows were written.
    """
    if not errors:
        return 0
    named = spark.createDataFrame(errors, "topic string, `partition` int, `offset` bigint, "
                                          "`table` string, error string")
    rows = (records.select("key", "value", "topic", "partition", "offset")
            .join(named, ["topic", "partition", "offset"])
            .select(F.lit(projection).alias("projection"), "table", "topic", "partition", "offset",
                    "key", "value", "error", F.lit(batch_id).cast("bigint").alias("batch_id"),
                    F.current_timestamp().alias("failed_at")))
    target = path(settings, projection)
    ensure_table(spark, target, SCHEMA, {"delta.appendOnly": "true"})
    commit_batch(spark, f"{projection}:dead_letters", batch_id,
                 lambda: rows.write.format("delta").mode("append").save(target), fence)
    return len(errors)
