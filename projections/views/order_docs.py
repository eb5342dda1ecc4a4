"""Order documents: one search-engine-style document per order.

A table-table join of orders, customers and order_items, kept current incrementally: a
change on any side recomputes the documents of the orders it touches, and only those.

Input:  the batch's changes of orders, order_items and customers (via the views'
        projection.py); the current rows from the mirrors, which have applied the batch
        (views step 1).
Key:    order_id.
Target: <lake>/order_docs: the order's fields, its customer embedded (a struct), its lines
        as a nested array ordered by line number, the total of its lines, and
        `doc_version` / `doc_version_lsn`: the latest source position that shaped the
        document, the customer's and the lines' included (deletes too: a removed line
        shaped it). A deleted order stays as a document with `deleted` set, so a search
        index can delete it with a version that never goes backwards. Both are the same
        however the changes were cut into batches, so a rebuild equals the live table.
Apply:  affected orders = orders changed, orders of changed lines (both the old and the
        new order of a moved line: its key changes, so Debezium sends a delete and a
        create), orders whose customer changed (through the mirror, and through the
        documents for an order that has just left the customer). One MERGE writes their
        recomputed documents; the version never decreases.
        Then, when a search index is configured (LAKESYNC_SEARCH_URL), the same
        documents go to index `order_docs` with the bulk API, versioned by doc_version
        (sync/search.py): a replayed batch re-sends equal versions (accepted, no change),
        an older version never overwrites a newer one, a deleted order is deleted.
Oracle: DOCS_SQL on Postgres, over the documents not deleted; the index too (`check_index`).
"""

from __future__ import annotations

import time
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.views.context import Context
from sync import search
from sync.compare import Report, compare, oracle_columns
from sync.config import Settings
from sync.delta import catalog
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table
from sync.projection import Target

NAME = "order_docs"
LINE = "struct<line_no:int,product_id:bigint,qty:int,unit_price:decimal(12,2)>"
CUSTOMER = "struct<id:bigint,name:string,email:string,tier:string>"
SCHEMA = (f"order_id bigint, status string, placed_at timestamp, updated_at timestamp, customer {CUSTOMER}, "
          f"lines array<{LINE}>, total decimal(38,2), deleted boolean, doc_version bigint, doc_version_lsn bigint, "
          "`_applied_at` timestamp")
DOCS_SQL = """
SELECT o.id AS order_id, o.status, o.placed_at, o.updated_at,
       CASE WHEN c.id IS NOT NULL THEN
         jsonb_build_object('id', c.id, 'name', c.name, 'email', c.email, 'tier', c.tier) END AS customer,
       COALESCE(l.lines, '[]'::jsonb) AS lines,
       COALESCE(l.total, 0) AS total
FROM orders o
LEFT JOIN customers c ON c.id = o.customer_id
LEFT JOIN LATERAL (
  SELECT jsonb_agg(jsonb_build_object('line_no', i.line_no, 'product_id', i.product_id, 'qty', i.qty,
                                      'unit_price', i.unit_price) ORDER BY i.line_no) AS lines,
         sum(i.qty * i.unit_price) AS total
  FROM order_items i WHERE i.order_id = o.id) l ON true
""".strip()
INDEX = "order_docs"
MONEY = {"type": "double"}  # indexed rounded for range queries; `_source` keeps the exact digits
INDEX_MAPPINGS = {"dynamic": "strict", "properties": {
    "order_id": {"type": "long"}, "status": {"type": "keyword"},
    "placed_at": {"type": "date"}, "updated_at": {"type": "date"},
    "customer": {"properties": {"id": {"type": "long"}, "name": {"type": "text"},
                                "email": {"type": "keyword"}, "tier": {"type": "keyword"}}},
    "lines": {"type": "nested", "properties": {"line_no": {"type": "integer"}, "product_id": {"type": "long"},
                                               "qty": {"type": "integer"}, "unit_price": MONEY}},
    "total": MONEY, "doc_version_lsn": {"type": "long"}}}
COMPARED = ["order_id", "status", "placed_at", "updated_at", "customer", "lines", "total"]
PUSH_ATTEMPTS = 4
ORDERS = ("id bigint, customer_id bigint, status string, placed_at timestamp, updated_at timestamp, "
          "`_commit_lsn` bigint, `_lsn` bigint")
CUSTOMERS = "id bigint, name string, email string, tier string, `_commit_lsn` bigint, `_lsn` bigint"
ITEMS = ("order_id bigint, line_no int, product_id bigint, qty int, unit_price decimal(12,2), "
         "`_commit_lsn` bigint, `_lsn` bigint")


def path(settings: Settings) -> str:
    return str(catalog.root(settings, "views") / "order_docs")


INDEX_TARGET = "search.order_docs"  # the documents in the search index (checked by `check_index`)


def targets(settings: Settings) -> list[Target]:
    found = [Target(name="view.order_docs", kind="documents", table=path(settings), keys=["order_id"],
                    oracle_sql=DOCS_SQL, source="orders, customers, order_items", target_filter="NOT deleted")]
    if settings.search_url:
        found.append(Target(name=INDEX_TARGET, kind="search index", table=f"{settings.search_url}/{INDEX}",
                            keys=["order_id"], source="view.order_docs", delta=False))
    return found


def ensure(spark: SparkSession, settings: Settings, fence: Fence) -> None:
    ensure_table(spark, path(settings), SCHEMA, fence.properties)


def _position(frame: DataFrame) -> DataFrame:
    return frame.select("_commit_lsn", "_lsn")


def touched(context: Context, docs: DataFrame, orders: DataFrame) -> DataFrame:
    """Every order the batch touches, with `changed_at`: the latest change of the order's
    own row or of its lines in the batch (null when only its customer changed).

    A customer's change recomputes the documents of its orders, but its position is not
    taken as theirs here: which orders a customer owned "before" depends on where the
    batches were cut, and a rebuild must give the same documents whatever the cut. The
    current customer's position enters the version through the mirror (`documents`), and
    a customer can only leave an order through a change of the order's row."""
    def key(name):
        return F.get_json_object("key", f"$.{name}").cast("bigint")

    position = F.struct("_commit_lsn", "_lsn")
    by_order = context.changes_of("orders").select(key("id").alias("order_id"), position.alias("at"))
    by_line = context.changes_of("order_items").select(key("order_id").alias("order_id"), position.alias("at"))
    touching = by_order.unionByName(by_line)
    if context.holds("customers"):  # (else no scan of the orders mirror and the documents for them)
        # Each customer once: a customer changed n times in the batch would otherwise join
        # each of its orders n times (a bench batch's sort ran out of a 3 GB heap on that).
        customers = context.changes_of("customers").select(key("id").alias("customer_id")).distinct()
        # A customer's orders now (mirror) and as the documents last embedded them.
        owners = (orders.select(F.col("id").alias("order_id"), "customer_id")
                  .unionByName(docs.where("NOT deleted").select("order_id", F.col("customer.id").alias("customer_id"))))
        no_position = F.lit(None).cast(by_order.schema["at"].dataType).alias("at")
        touching = touching.unionByName(customers.join(owners, "customer_id").select("order_id", no_position))
    return touching.groupBy("order_id").agg(F.max("at").alias("changed_at"))


def documents(affected: DataFrame, orders: DataFrame, customers: DataFrame, items: DataFrame,
              docs: DataFrame, high: tuple[int, int]) -> DataFrame:
    """The documents of the affected orders, recomputed (a vanished order: deleted).

    `high` is the batch's latest source position. The mirrors have applied at least the
    batch, and may have applied some of the next one, one table at a time: a position
    read from them beyond `high` is not taken into the version. The change it belongs
    to touches the document again in its own batch; a version taken early would depend
    on how far the mirrors happened to be, and a rebuild would not give it."""
    limit = F.struct(F.lit(high[0]).cast("bigint").alias("_commit_lsn"), F.lit(high[1]).cast("bigint").alias("_lsn"))

    def seen(position):
        return F.when(position <= limit, position)

    lines = (items.join(affected.select("order_id"), "order_id")
             .groupBy("order_id").agg(
                 F.array_sort(F.collect_list(F.struct("line_no", "product_id", "qty", "unit_price"))).alias("lines"),
                 F.sum(F.col("qty") * F.col("unit_price")).alias("total"),
                 F.max(seen(F.struct("_commit_lsn", "_lsn"))).alias("lines_at")))
    o = orders.alias("o")
    c = customers.alias("c")
    previous = docs.select("order_id", F.struct(F.col("doc_version").alias("_commit_lsn"),
                                                 F.col("doc_version_lsn").alias("_lsn")).alias("previous_at"))
    joined = (affected.join(o, F.col("order_id") == F.col("o.id"), "left")
              .join(c, F.col("c.id") == F.col("o.customer_id"), "left")
              .join(lines, "order_id", "left")
              .join(previous, "order_id", "left"))
    exists = F.col("o.id").isNotNull()
    version = F.greatest(F.col("changed_at"), F.col("previous_at"), F.col("lines_at"),
                         F.when(exists, seen(F.struct(F.col("o._commit_lsn"), F.col("o._lsn")))),
                         F.when(F.col("c.id").isNotNull(), seen(F.struct(F.col("c._commit_lsn"), F.col("c._lsn")))))
    # Every position that shaped it is ahead (an order reached through its customer whose
    # own row the mirror has already moved on): the batch's position stands in, below
    # the version the ahead change will give it in its own batch.
    version = F.coalesce(version, limit)
    customer = F.when(F.col("c.id").isNotNull(), F.struct("c.id", "c.name", "c.email", "c.tier"))
    # An order gone from Postgres keeps a deleted document if it ever had one, or if its
    # own row changed in this batch: a rebuild seeing it created and deleted in one batch
    # writes the same deleted document as a live run seeing it in two.
    return (joined.where(exists | F.col("previous_at").isNotNull() | F.col("changed_at").isNotNull())
            .select("order_id",
                    F.col("o.status").alias("status"), F.col("o.placed_at").alias("placed_at"),
                    F.col("o.updated_at").alias("updated_at"),
                    F.when(exists, customer).cast(CUSTOMER).alias("customer"),
                    F.when(exists, F.coalesce("lines", F.array().cast(f"array<{LINE}>"))).alias("lines"),
                    F.when(exists, F.coalesce("total", F.lit(0))).cast("decimal(38,2)").alias("total"),
                    (~exists).alias("deleted"),
                    version["_commit_lsn"].alias("doc_version"), version["_lsn"].alias("doc_version_lsn"),
                    F.current_timestamp().alias("_applied_at")))


def prepare(context: Context) -> DataFrame | None:
    """The batch's documents, recomputed but not yet written. Also leaves, for the
    summaries, every customer an affected order belonged to before or now
    (`orders_changed`) and the documents as they will be (`docs_after`). The summaries
    commit before the documents do: once the documents are written, a replay of the
    batch could no longer tell which customer an order has just left."""
    docs = context.view(path(context.settings))
    context.docs_after, context.orders_changed = docs, None
    if not context.holds("orders", "order_items", "customers"):
        return None
    orders = context.mirror("orders", ORDERS)
    affected = touched(context, docs, orders).localCheckpoint()
    if affected.isEmpty():  # (only customers without orders changed)
        return None
    fresh = documents(affected, orders.join(affected.select(F.col("order_id").alias("id")), "id"),
                      context.mirror("customers", CUSTOMERS), context.mirror("order_items", ITEMS),
                      docs.join(affected.select("order_id"), "order_id"), context.contents.high).localCheckpoint()
    context.orders_changed = (docs.join(affected.select("order_id"), "order_id")
                              .select(F.col("customer.id").alias("customer_id"))
                              .unionByName(fresh.select(F.col("customer.id").alias("customer_id")))
                              .where("customer_id IS NOT NULL").distinct().localCheckpoint())
    context.docs_after = docs.join(affected.select("order_id"), "order_id", "left_anti").unionByName(fresh)
    return fresh


def commit(context: Context, fresh: DataFrame | None) -> int:
    """One MERGE of the prepared documents, then the search index (when configured)."""
    if fresh is None:
        return 0
    target = path(context.settings)
    builder = (DeltaTable.forPath(context.spark, target).alias("t").merge(fresh.alias("s"), "t.order_id = s.order_id")
               .whenMatchedUpdateAll().whenNotMatchedInsertAll())
    metrics = context.commit.merge(builder, target, NAME)
    if context.settings.search_url:
        push(context.settings.search_url, fresh)
    return int(metrics.get("num_affected_rows", 0))


def push(url: str, docs: DataFrame) -> dict:
    """The batch's documents to the search index, each versioned by its source position.
    A node that is briefly unreachable is retried; then the batch fails and replays."""
    actions = [{"id": row["order_id"], "version": row["doc_version"], "deleted": row["deleted"],
                "source": {**{k: row[k] for k in COMPARED}, "doc_version_lsn": row["doc_version_lsn"]}}
               for row in (r.asDict(recursive=True) for r in docs.collect())]  # one job (a batch's documents)
    search.ensure_index(url, INDEX, INDEX_MAPPINGS)
    for attempt in range(PUSH_ATTEMPTS):
        try:
            return search.push(url, INDEX, actions)
        except search.ServiceUnavailable:
            if attempt == PUSH_ATTEMPTS - 1:
                raise
            time.sleep(2 ** attempt)
    return {}


def check_index(settings: Settings, conn, target: Target) -> Report:
    """verify's comparison for the search index: every live document against DOCS_SQL."""
    columns, types = oracle_columns(conn, DOCS_SQL)
    expected = conn.execute(DOCS_SQL).fetchall()
    indexed = []
    for source in search.scan(settings.search_url, INDEX, sort="order_id"):
        for name in ("placed_at", "updated_at"):
            source[name] = datetime.fromisoformat(source[name]) if source.get(name) else None
        indexed.append(tuple(source.get(c) for c in columns))
    return compare(target, expected, indexed, columns, types, ["order_id"])
