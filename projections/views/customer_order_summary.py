"""Customer order summary: per customer, name, tier, order count, lifetime value, last order.

A table-table view over customers and the order documents, kept current incrementally.

Input:  the batch's customer changes, and the customers whose orders' documents changed
        in this batch (before and after: an order moved to another customer changes both).
Key:    customer_id.
Target: <lake>/customer_order_summary.
Apply:  recompute the affected customers from the customers mirror and the documents of
        their orders as this batch leaves them (projections/views/order_docs.py `prepare`), then
        one MERGE: update or insert them, delete the ones no longer in Postgres.
Oracle: SUMMARY_SQL on Postgres.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from projections.views.context import Context
from sync.config import Settings
from sync.delta import catalog
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table
from sync.projection import Target

NAME = "customer_order_summary"
SCHEMA = ("customer_id bigint, name string, tier string, order_count bigint, lifetime_value decimal(38,2), "
          "last_order_at timestamp, `_applied_at` timestamp")
SUMMARY_SQL = """
SELECT c.id AS customer_id, c.name, c.tier,
       count(DISTINCT o.id) AS order_count,
       COALESCE(sum(i.qty * i.unit_price), 0) AS lifetime_value,
       max(o.placed_at) AS last_order_at
FROM customers c
LEFT JOIN orders o ON o.customer_id = c.id
LEFT JOIN order_items i ON i.order_id = o.id
GROUP BY c.id, c.name, c.tier
""".strip()


def path(settings: Settings) -> str:
    return str(catalog.root(settings, "views") / "customer_order_summary")


def targets(settings: Settings) -> list[Target]:
    return [Target(name="view.customer_order_summary", kind="view", table=path(settings), keys=["customer_id"],
                   oracle_sql=SUMMARY_SQL, source="customers, orders, order_items")]


def ensure(spark: SparkSession, settings: Settings, fence: Fence) -> None:
    ensure_table(spark, path(settings), SCHEMA, fence.properties)


def apply(context: Context) -> int:
    if not context.holds("customers") and context.orders_changed is None:
        return 0  # no customer's orders or attributes changed
    spark = context.spark
    changed = (context.changes_of("customers")
               .select(F.get_json_object("key", "$.id").cast("bigint").alias("customer_id")))
    if context.orders_changed is not None:
        changed = changed.unionByName(context.orders_changed)
    affected = changed.distinct().localCheckpoint()
    if affected.isEmpty():
        return 0
    customers = (context.mirror("customers", "id bigint, name string, tier string")
                 .withColumnRenamed("id", "customer_id").join(affected, "customer_id"))
    docs = (context.docs_after.where("NOT deleted")
            .select(F.col("customer.id").alias("customer_id"), "order_id", "total", "placed_at")
            .join(affected, "customer_id"))
    totals = docs.groupBy("customer_id").agg(F.count("order_id").alias("order_count"),
                                             F.sum("total").alias("lifetime_value"),
                                             F.max("placed_at").alias("last_order_at"))
    rows = (affected.join(customers, "customer_id", "left").join(totals, "customer_id", "left")
            .select("customer_id", "name", "tier",
                    F.when(F.col("name").isNotNull(), F.coalesce("order_count", F.lit(0))).alias("order_count"),
                    F.coalesce("lifetime_value", F.lit(0)).cast("decimal(38,2)").alias("lifetime_value"),
                    "last_order_at",
                    F.col("name").isNull().alias("_gone"),  # name is NOT NULL in Postgres: no row, no customer
                    F.current_timestamp().alias("_applied_at"))
            .localCheckpoint())
    columns = [c for c in rows.columns if c != "_gone"]
    builder = (DeltaTable.forPath(spark, path(context.settings)).alias("t")
               .merge(rows.alias("s"), "t.customer_id = s.customer_id")
               .whenMatchedDelete(condition="s._gone")
               .whenMatchedUpdate(set={c: f"s.{c}" for c in columns})
               .whenNotMatchedInsert(condition="NOT s._gone", values={c: f"s.{c}" for c in columns}))
    metrics = context.commit.merge(builder, path(context.settings), NAME)
    return int(metrics.get("num_affected_rows", 0))
