"""Customer history: SCD type 2, one row per version of each customer.

Input:  the customers' change events in the bronze changelog (via the views' projection.py),
        never Kafka: a compacted topic has dropped a key's older versions, the changelog
        has them all.
Key:    (id, valid_from_commit_lsn, valid_from_lsn): a version starts at the source
        position of the change that made it.
Target: <lake>/customer_history: the customer's columns (not `bio`: long TOASTed text,
        which Debezium leaves out of an update that does not change it), `deleted` for
        the version a delete starts, valid-from and valid-to as source positions and
        Postgres commit times, and `is_current` (the latest version, not a delete).
Apply:  per batch: the batch's changes become candidate versions, one per source
        position (a redelivered change repeats its position and is the same version);
        together with the stored versions of the same customers they are ordered by
        position, each version's valid-to is the next one's valid-from, and one MERGE
        inserts the new versions and closes (or re-opens) the stored ones whose valid-to
        changed. A change arriving out of order therefore slots in between versions.
Oracle: the current versions equal `customers` on Postgres (ORACLE below). Truncating
        customers (which the foreign keys make rare) is not versioned.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from projections.views.context import Context
from sync.config import Settings
from sync.delta import catalog
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table
from sync.projection import Target

NAME = "customer_history"
ATTRIBUTES = "id bigint, name string, email string, tier string, created_at string, updated_at string"
SCHEMA = ("id bigint, name string, email string, tier string, created_at timestamp, updated_at timestamp, "
          "deleted boolean, valid_from_commit_lsn bigint, valid_from_lsn bigint, valid_from_ts timestamp, "
          "valid_to_commit_lsn bigint, valid_to_lsn bigint, valid_to_ts timestamp, is_current boolean, "
          "`_op` string, `_topic` string, `_partition` int, `_offset` bigint, `_applied_at` timestamp")
VERSION_KEY = ["id", "valid_from_commit_lsn", "valid_from_lsn"]
ORACLE = "SELECT id, name, email, tier, created_at, updated_at FROM customers"


def path(settings: Settings) -> str:
    return str(catalog.root(settings, "views") / "customer_history")


def targets(settings: Settings) -> list[Target]:
    return [Target(name="history.customers", kind="history", table=path(settings), keys=["id"],
                   oracle_sql=ORACLE, source="customers", target_filter="is_current")]


def ensure(spark: SparkSession, settings: Settings, fence: Fence) -> None:
    ensure_table(spark, path(settings), SCHEMA, fence.properties)


def versions(changes: DataFrame) -> DataFrame:
    """Change events of customers -> candidate versions (one per source position)."""
    after = F.from_json("after", ATTRIBUTES)
    deleted = F.col("_op") == "d"
    attribute = lambda name: F.when(~deleted, after[name])  # noqa: E731  (a delete has no after image)
    return (changes.select(
        F.get_json_object("key", "$.id").cast("bigint").alias("id"),
        attribute("name").alias("name"), attribute("email").alias("email"), attribute("tier").alias("tier"),
        attribute("created_at").cast("timestamp").alias("created_at"),
        attribute("updated_at").cast("timestamp").alias("updated_at"),
        deleted.alias("deleted"),
        F.col("_commit_lsn").alias("valid_from_commit_lsn"), F.col("_lsn").alias("valid_from_lsn"),
        F.col("_source_ts").alias("valid_from_ts"),
        "_op", "_topic", "_partition", "_offset")
        .dropDuplicates(VERSION_KEY))


def close(all_versions: DataFrame) -> DataFrame:
    """Each version's valid-to is the next version's valid-from (pure; null for the last)."""
    order = Window.partitionBy("id").orderBy("valid_from_commit_lsn", "valid_from_lsn")
    following = F.lead(F.struct("valid_from_commit_lsn", "valid_from_lsn", "valid_from_ts")).over(order)
    return (all_versions
            .withColumn("_next", following)
            .withColumn("valid_to_commit_lsn", F.col("_next.valid_from_commit_lsn"))
            .withColumn("valid_to_lsn", F.col("_next.valid_from_lsn"))
            .withColumn("valid_to_ts", F.col("_next.valid_from_ts"))
            .withColumn("is_current", F.col("_next").isNull() & ~F.col("deleted"))
            .drop("_next"))


def apply(context: Context) -> int:
    spark = context.spark
    target = path(context.settings)
    context.history_changed = None
    if not context.holds("customers"):
        return 0  # (every customer change is a version: with one, `new` is never empty)
    new = versions(context.changes_of("customers")).localCheckpoint()
    stored = context.view(target).join(F.broadcast(new.select("id").distinct()), "id")
    fresh = new.join(stored.select(*VERSION_KEY), VERSION_KEY, "left_anti")
    columns = spark.createDataFrame([], SCHEMA).columns
    candidates = fresh.withColumn("_applied_at", F.current_timestamp())
    merged = close(stored.drop("valid_to_commit_lsn", "valid_to_lsn", "valid_to_ts", "is_current")
                   .unionByName(candidates)).select(*columns).localCheckpoint()
    # For the enriched ledger: per customer, the first position of this batch's versions.
    # From the batch itself, not from what was new to the table: a replay after a crash
    # between this commit and the enriched ledger's must re-enrich the same entries.
    context.history_changed = (new.groupBy("id").agg(F.min(F.struct("valid_from_commit_lsn", "valid_from_lsn"))
                                                  .alias("since"))
                               .select("id", F.col("since.valid_from_commit_lsn").alias("since_commit_lsn"),
                                       F.col("since.valid_from_lsn").alias("since_lsn")))
    on = " AND ".join(f"t.{k} = s.{k}" for k in VERSION_KEY)
    changed = ("NOT (t.valid_to_commit_lsn <=> s.valid_to_commit_lsn AND t.valid_to_lsn <=> s.valid_to_lsn "
               "AND t.is_current <=> s.is_current)")
    builder = (DeltaTable.forPath(spark, target).alias("t").merge(merged.alias("s"), on)
               .whenMatchedUpdate(condition=changed, set={c: f"s.{c}" for c in (
                   "valid_to_commit_lsn", "valid_to_lsn", "valid_to_ts", "is_current")})
               .whenNotMatchedInsertAll())
    metrics = context.commit.merge(builder, target, NAME)
    return int(metrics.get("num_affected_rows", 0))
