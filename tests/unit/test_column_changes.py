"""The column history's pure parts (sync/cdc/columns.py): which name a record used, which
columns a batch ends with, what a record of the column changes' topic says."""

import json

from sync.cdc.columns import ColumnChange, add, current_names, earlier_names, parse, until

# At (the commit LSN before each change's transaction, the change's own LSN):
A_TO_B = ColumnChange((10, 15), "a", "b")
B_TO_C = ColumnChange((20, 25), "b", "c")
X_DROPPED = ColumnChange((30, 35), "x", None)
HISTORY = [A_TO_B, B_TO_C, X_DROPPED]


def test_a_column_renamed_twice_had_each_earlier_name_before_each_rename():
    assert earlier_names("c", HISTORY) == [((20, 25), "b"), ((10, 15), "a")]
    assert earlier_names("id", HISTORY) == []


def test_a_column_named_like_a_dropped_one_did_not_exist_before_the_drop():
    assert earlier_names("x", HISTORY) == [((30, 35), None)]
    # Renamed into the name a dropped column had: it was `y` before, never that `x`.
    assert earlier_names("x", [ColumnChange((5, 6), "x", None), ColumnChange((6, 7), "y", "x")]) == [((6, 7), "y")]


def test_a_batchs_columns_under_the_names_the_changes_after_its_last_record_gave_them():
    assert current_names(["id", "a", "x"], HISTORY, (5, 9)) == ["id", "c", None]
    assert current_names(["id", "b", "x"], HISTORY, (15, 17)) == ["id", "c", None]
    assert current_names(["id", "c"], HISTORY, (40, 41)) == ["id", "c"]
    assert current_names(["id", "a", "x"], HISTORY, None) == ["id", "c", None]


def test_a_snapshot_read_is_as_of_its_own_lsn():
    """A snapshot read's position has no commit LSN (sync/cdc/ordering.py): it saw the
    changes made before its LSN."""
    assert current_names(["id", "b", "x"], HISTORY, (0, 18)) == ["id", "c", None]  # after A_TO_B only
    assert until(HISTORY, (0, 18)) == [A_TO_B]
    assert until(HISTORY, (20, 25)) == [A_TO_B, B_TO_C]


def _record(op="c", sequence=("20", "25"), **row):
    after = {"schema_name": "shop", "table_name": "t", "change": "rename", "old_name": "b", "new_name": "c", **row}
    return json.dumps({"schema": {}, "payload": {"op": op, "after": after,
                                                 "source": {"sequence": json.dumps(list(sequence))}}})


def test_a_record_of_the_column_changes_topic():
    assert parse(_record()) == (("shop", "t"), B_TO_C)
    dropped = _record(change="drop", old_name="x", new_name=None, sequence=("30", "35"))
    assert parse(dropped) == (("shop", "t"), X_DROPPED)
    assert parse(_record(op="r")) is None  # a snapshot read: at the snapshot's position, not the change's
    assert parse(None) is None  # a tombstone


def test_a_change_read_twice_is_kept_once_in_order():
    history = {}
    for change in (B_TO_C, A_TO_B, B_TO_C):
        add(history, ("shop", "t"), change)
    assert history == {("shop", "t"): [A_TO_B, B_TO_C]}
