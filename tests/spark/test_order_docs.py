"""The order documents' version on real Spark, with mirrors partly ahead of the batch.

The mirrors apply a batch one table at a time, so a views batch can read a row the
mirrors have already moved past the batch's changes. A document's version must not take
such a position (it would depend on timing, and a rebuild would not give it), yet must
always exist: the search index refuses a document without one.
"""

from datetime import datetime

import pytest

from projections.views import order_docs

pytestmark = pytest.mark.spark

AT = "struct<_commit_lsn:bigint,_lsn:bigint>"
PLACED = datetime(2026, 1, 1, 12, 0, 0, 123456)


def recompute(spark, changed_at, order_at, customer_at, high):
    affected = spark.createDataFrame([(7, changed_at)], f"order_id bigint, changed_at {AT}")
    orders = spark.createDataFrame([(7, 3, "placed", PLACED, PLACED, *order_at)], order_docs.ORDERS)
    customers = spark.createDataFrame([(3, "Ada", "ada@example.com", "gold", *customer_at)], order_docs.CUSTOMERS)
    items = spark.createDataFrame([], order_docs.ITEMS)
    docs = spark.createDataFrame([], order_docs.SCHEMA)
    row = order_docs.documents(affected, orders, customers, items, docs, high).first()
    return row["doc_version"], row["doc_version_lsn"]


def test_a_customer_ahead_of_the_batch_does_not_give_the_version(spark):
    # The order changed at (100, 5), in the batch; the customer mirror is already at (120, 1).
    assert recompute(spark, (100, 5), (100, 5), (120, 1), high=(100, 9)) == (100, 5)


def test_positions_inside_the_batch_give_the_latest(spark):
    assert recompute(spark, None, (90, 2), (95, 1), high=(100, 9)) == (95, 1)


def test_an_order_whose_every_position_is_ahead_takes_the_batch_position(spark):
    # Reached through its customer's change only; the mirror already holds the order's and
    # the customer's later changes. Those touch it again in their own batch.
    assert recompute(spark, None, (130, 1), (120, 1), high=(100, 9)) == (100, 9)
