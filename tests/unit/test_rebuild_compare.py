"""`rebuild --verify`'s comparison of a live and a rebuilt table (sync/commands/rebuild.py
`compare`, read by DuckDB), on tables delta-rs writes: a multiset difference both ways,
by key where the table has one."""

import datetime as dt

import pyarrow as pa
from deltalake import write_deltalake

from sync.commands.rebuild import compare
from sync.delta import reader
from sync.projection import Target


def table(path, rows, keys=("id",), applied_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
          extra: dict | None = None) -> Target:
    """A Delta table of `rows` (id, v, a list, a name to be quoted), written in two files,
    and its target."""
    for part in (rows[: len(rows) // 2], rows[len(rows) // 2:]):
        write_deltalake(str(path), pa.table({
            "id": pa.array([i for i, _ in part], pa.int32()),
            "v": pa.array([v for _, v in part], pa.string()),
            "a list": pa.array([[i, i] for i, _ in part], pa.list_(pa.int64())),
            "_applied_at": pa.array([applied_at] * len(part), pa.timestamp("us", tz="UTC")),
            **{name: pa.array([value] * len(part)) for name, value in (extra or {}).items()},
        }), mode="append")
    return Target(name="view.t", kind="view", table=str(path), keys=list(keys))


def test_equal_tables_are_equal_whatever_their_order_and_their_write_times(tmp_path):
    rows = [(i, f"v{i}") for i in range(20)]
    live = table(tmp_path / "live", rows)
    rebuilt = table(tmp_path / "rebuilt", list(reversed(rows)), applied_at=dt.datetime.now(dt.timezone.utc))
    result = compare(reader.connect(), live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences, result.sample) == (20, 20, 0, [])


def test_a_changed_a_missing_and_an_extra_row_are_their_keys(tmp_path):
    live = table(tmp_path / "live", [(1, "a"), (2, "b"), (3, "c")])
    rebuilt = table(tmp_path / "rebuilt", [(1, "a"), (2, "B"), (4, "d")])
    result = compare(reader.connect(), live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (3, 3, 3)
    assert sorted(row["id"] for row in result.sample) == [2, 3, 4]


def test_without_keys_each_surplus_copy_of_a_row_is_a_difference(tmp_path):
    live = table(tmp_path / "live", [(1, "a"), (1, "a"), (2, None)], keys=())
    rebuilt = table(tmp_path / "rebuilt", [(1, "a"), (2, None), (2, None), (2, None)], keys=())
    result = compare(reader.connect(), live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (3, 4, 3)  # one (1, a), two (2, null)
    assert {(row["id"], row["v"], tuple(row["a list"])) for row in result.sample} == {(1, "a", (1, 1)),
                                                                                    (2, None, (2, 2))}


def test_a_table_on_one_side_only_differs_by_all_its_rows(tmp_path):
    live = table(tmp_path / "live", [(1, "a"), (2, "b")])
    missing = Target(name="view.t", kind="view", table=str(tmp_path / "never"), keys=["id"])
    result = compare(reader.connect(), live, missing)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (2, 0, 2)


def test_tables_of_other_columns_differ(tmp_path):
    live = table(tmp_path / "live", [(1, "a"), (2, "b")])
    rebuilt = table(tmp_path / "rebuilt", [(1, "a"), (2, "b")], extra={"more": "x"})
    result = compare(reader.connect(), live, rebuilt)
    assert (result.live_rows, result.rebuilt_rows, result.differences) == (2, 2, 1)
    assert "columns differ" in result.sample[0]
