"""`rebuild --verify`'s comparison of a live and a rebuilt table, on real Spark and Delta:
a multiset difference both ways, by key where the table has one."""

import pytest

from sync.commands.rebuild import compare
from sync.projection import Target

pytestmark = pytest.mark.spark

COLUMNS = "id int, v string, _applied_at timestamp"


def table(spark, path, rows, keys=("id",)) -> Target:
    """A Delta table of `rows` (id, v), written in two files, and its target."""
    frame = spark.createDataFrame([(i, v, None) for i, v in rows], COLUMNS).repartition(2)
    frame.write.format("delta").mode("overwrite").save(str(path))
    return Target(name="view.t", kind="view", table=str(path), keys=list(keys))


def test_equal_tables_are_equal_whatever_their_order_and_their_write_times(spark, tmp_path):
    rows = [(i, f"v{i}") for i in range(20)]
    live = table(spark, tmp_path / "live", rows)
    rebuilt = table(spark, tmp_path / "rebuilt", list(reversed(rows)))
    spark.sql(f"UPDATE delta.`{rebuilt.table}` SET _applied_at = current_timestamp()")  # not compared
    result = compare(spark, live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences, result.sample) == (20, 20, 0, [])


def test_a_changed_a_missing_and_an_extra_row_are_their_keys(spark, tmp_path):
    live = table(spark, tmp_path / "live", [(1, "a"), (2, "b"), (3, "c")])
    rebuilt = table(spark, tmp_path / "rebuilt", [(1, "a"), (2, "B"), (4, "d")])
    result = compare(spark, live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (3, 3, 3)
    assert sorted(row["id"] for row in result.sample) == [2, 3, 4]


def test_without_keys_each_surplus_copy_of_a_row_is_a_difference(spark, tmp_path):
    live = table(spark, tmp_path / "live", [(1, "a"), (1, "a"), (2, None)], keys=())
    rebuilt = table(spark, tmp_path / "rebuilt", [(1, "a"), (2, None), (2, None), (2, None)], keys=())
    result = compare(spark, live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (3, 4, 3)  # one (1, a), two (2, null)
    assert {(row["id"], row["v"]) for row in result.sample} == {(1, "a"), (2, None)}


def test_a_table_on_one_side_only_differs_by_all_its_rows(spark, tmp_path):
    live = table(spark, tmp_path / "live", [(1, "a"), (2, "b")])
    missing = Target(name="view.t", kind="view", table=str(tmp_path / "never"), keys=["id"])
    result = compare(spark, live, missing)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (2, 0, 2)
