"""verify's comparison: canonical values, order independence, differing keys named, multisets."""

import datetime as dt
from decimal import Decimal

from sync.compare import canonical, compare, readable
from sync.projection import Target

TARGET = Target(name="mirror.t", kind="mirror", table="/nowhere")
COLUMNS = ["id", "price", "at", "doc"]
TYPES = ["bigint", "numeric", "timestamp with time zone", "jsonb"]


def test_canonical_forms_agree_across_sides():
    utc = dt.datetime(2024, 3, 31, 1, 30, 0, 123456)
    berlin = dt.datetime(2024, 3, 31, 3, 30, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert canonical(berlin, "timestamp with time zone") == canonical(utc, "timestamp with time zone")
    assert canonical(Decimal("1.50"), "numeric") == canonical("1.5", "numeric") == "1.5"
    assert canonical({"b": 1, "a": [1, 2]}, "jsonb") == canonical('{"a": [1, 2], "b": 1}', "jsonb")
    assert canonical(b"\x00\xff", "bytea") == canonical(bytearray(b"\x00\xff"), "bytea") == "00ff"
    assert canonical(dt.time(1, 2, 3, 4), "time without time zone") == "01:02:03.000004"
    assert canonical(None, "text") != canonical("", "text")
    assert canonical(Decimal("NaN"), "numeric") == "NaN"


def rows(*specs):
    return [(i, Decimal(p), dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), {"k": i}) for i, p in specs]


def test_equal_sets_in_any_order_have_no_difference():
    report = compare(TARGET, rows((1, "1.0"), (2, "2.5")), list(reversed(rows((1, "1.00"), (2, "2.50")))),
                     COLUMNS, TYPES, ["id"])
    assert (report.source_rows, report.target_rows, report.differences) == (2, 2, 0)
    assert report.source_hash == report.target_hash


def test_differences_name_the_keys_with_both_sides():
    report = compare(TARGET, rows((1, "1"), (2, "2"), (3, "3")), rows((1, "1"), (2, "9"), (4, "4")),
                     COLUMNS, TYPES, ["id"])
    assert report.differences == 3
    by_key = {s["key"]["id"]: s for s in report.sample}
    assert by_key["2"]["source"]["price"] == "2" and by_key["2"]["target"]["price"] == "9"
    assert by_key["3"]["target"] is None and by_key["4"]["source"] is None
    assert report.source_hash != report.target_hash


def test_a_key_held_twice_is_a_difference_even_when_both_copies_are_right():
    source = rows((1, "1.00"), (2, "2.00"))
    target = rows((1, "1.00"), (2, "2.00"), (2, "2.00"))
    report = compare(TARGET, source, target, COLUMNS, TYPES, ["id"])
    assert report.differences == 1 and report.target_rows == 3
    assert report.sample == [{"key": {"id": "2"}, "source": None, "target": "duplicate row"}]


def test_a_table_without_a_key_is_compared_as_a_multiset():
    source = rows((1, "1.00"), (1, "1.00"), (2, "2.00"))
    same = compare(TARGET, source, rows((2, "2.0"), (1, "1"), (1, "1.0")), COLUMNS, TYPES, [])
    assert (same.source_rows, same.target_rows, same.differences) == (3, 3, 0)
    assert same.source_hash == same.target_hash
    one_copy_short = compare(TARGET, source, rows((1, "1.00"), (2, "2.00"), (3, "3.00")), COLUMNS, TYPES, [])
    assert one_copy_short.differences == 2 and one_copy_short.source_hash != one_copy_short.target_hash
    by_id = {s["row"]["id"]: s for s in one_copy_short.sample}
    assert (by_id["1"]["source_copies"], by_id["1"]["target_copies"]) == (2, 1)
    assert (by_id["3"]["source_copies"], by_id["3"]["target_copies"]) == (0, 1)


def test_a_difference_shows_long_values_cut_with_their_length():
    """`lakesync verify` prints a differing 60 KB value as its two ends and its length."""
    toasted = "a" * 30000 + "b" * 30000
    shown = readable({"id": "7", "body": toasted, "tags": ["x" * 100, "short"]}, width=21)
    assert shown == {"id": "7", "body": "aaaaaaaaaa\u2026bbbbbbbbbb (60000 characters)",
                     "tags": ["xxxxxxxxxx\u2026xxxxxxxxxx (100 characters)", "short"]}
    assert readable("duplicate row") == "duplicate row" and readable(None) is None
