"""The Delta reader verify compares with (sync/delta/reader.py), on a table delta-rs writes."""

import datetime as dt
from decimal import Decimal

import pyarrow as pa
from deltalake import write_deltalake

from sync.delta import reader

UTC = dt.timezone.utc


def test_rows_come_in_the_asked_order_with_exact_types_and_a_missing_column_null(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        'a "quoted" name': pa.array(["x", None, "z"]),
        "amount": pa.array([Decimal("1.50"), Decimal("-0.01"), None], pa.decimal128(12, 2)),
        "at": pa.array([dt.datetime(2026, 1, 1, 23, 59, 59, 123456, tzinfo=UTC), None,
                        dt.datetime(2026, 6, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
        "tags": pa.array([["a"], [], None], pa.list_(pa.string())),
        "deleted": pa.array([False, True, False]),
    }))
    duck = reader.connect()
    rows = sorted(reader.rows(duck, path, ["at", "id", "gone", 'a "quoted" name', "amount", "tags"], "NOT deleted"))
    assert rows == [
        (dt.datetime(2026, 1, 1, 23, 59, 59, 123456), 1, None, "x", Decimal("1.50"), ["a"]),
        (dt.datetime(2026, 6, 1), 3, None, "z", None, None),
    ]
    assert all(type(r[4]) is Decimal for r in rows if r[4] is not None)
    assert len(list(reader.rows(duck, path, ["id"], batch_rows=1))) == 3
