"""Debezium field schemas map to exact Delta types."""

import pytest

from sync.cdc.decode import OWN_COLUMNS, WORKING_PREFIX, as_mirrored, mirrored
from sync.cdc.types import ColumnType, column_type, key_columns, quoted, table_columns


def field(name, kind, semantic=None, source_type=None, length=None, scale=None, **extra):
    f = {"field": name, "type": kind, "optional": True, **extra}
    if semantic:
        f["name"] = semantic
    if source_type:
        f["parameters"] = {"__debezium.source.column.type": source_type,
                           "__debezium.source.column.length": str(length or 0),
                           "__debezium.source.column.scale": str(scale or 0)}
    return f


def test_numeric_keeps_precision_and_scale():
    c = column_type(field("price", "string", source_type="NUMERIC", length=12, scale=2))
    assert (c.json_type, c.delta_type, c.convert) == ("string", "decimal(12,2)", "decimal")


def test_numeric_spark_cannot_hold_stays_exact_text():
    unconstrained = column_type(field("x", "string", source_type="NUMERIC", length=0))
    too_wide = column_type(field("y", "string", source_type="NUMERIC", length=50, scale=4))
    assert unconstrained.delta_type == "string" and too_wide.delta_type == "string"
    assert unconstrained.convert == "numeric_text"  # NAN -> NaN, POSITIVE_INFINITY -> Infinity


@pytest.mark.parametrize("semantic,kind,delta,convert", [
    ("io.debezium.time.ZonedTimestamp", "string", "timestamp", "timestamptz"),
    ("io.debezium.time.MicroTimestamp", "int64", "timestamp_ntz", "micros_ntz"),
    ("io.debezium.time.Date", "int32", "date", "epoch_days"),
    ("io.debezium.time.MicroTime", "int64", "string", "micros_time"),
    ("io.debezium.data.Json", "string", "string", "none"),
    ("io.debezium.data.Uuid", "string", "string", "none"),
])
def test_semantic_types(semantic, kind, delta, convert):
    c = column_type(field("c", kind, semantic=semantic))
    assert (c.delta_type, c.convert) == (delta, convert)


def test_primitives_and_bytes():
    assert column_type(field("b", "boolean")).delta_type == "boolean"
    assert column_type(field("i", "int16")).delta_type == "smallint"
    assert column_type(field("l", "int64")).delta_type == "bigint"
    assert column_type(field("f", "float")).delta_type == "float"
    assert column_type(field("d", "double")).delta_type == "double"
    raw = column_type(field("r", "bytes"))
    assert (raw.json_type, raw.delta_type, raw.convert) == ("string", "binary", "base64")


def test_arrays_convert_their_elements():
    c = column_type({"field": "due", "type": "array", "optional": True,
                     "items": {"type": "int32", "name": "io.debezium.time.Date", "optional": True}})
    assert c.delta_type == "array<date>" and c.json_type == "array<int>"
    assert c.element.convert == "epoch_days"


def test_unknown_type_is_refused():
    with pytest.raises(ValueError, match="unsupported"):
        column_type(field("m", "float64"))


def test_table_and_key_columns_from_envelope_schemas():
    row = {"type": "struct", "fields": [field("id", "int64"), field("name", "string")]}
    value_schema = {"fields": [{**row, "field": "before"}, {**row, "field": "after"}, {"field": "op"}]}
    assert [c.name for c in table_columns(value_schema)] == ["id", "name"]
    assert key_columns({"fields": [field("order_id", "int64"), field("line_no", "int32")]}) == ["order_id", "line_no"]



@pytest.mark.parametrize("name,identifier", [("id", "`id`"), ("Note Text", "`Note Text`"), ("a.b", "`a.b`"),
                                             ("back`tick", "`back``tick`"), ("it's", "`it's`")])
def test_any_column_name_is_one_quoted_identifier(name, identifier):
    assert quoted(name) == identifier
    assert ColumnType(name, "string", "string", "none").ddl() == f"{identifier} string"


def test_a_column_named_like_lakesyncs_own_takes_one_more_underscore_in_its_mirror():
    assert [mirrored(n) for n in ["_op", "__op", "_applied_at", "_unchanged", "_lakesync_key", "__lakesync_x"]] == [
        "__op", "___op", "__applied_at", "__unchanged", "__lakesync_key", "___lakesync_x"]
    assert [mirrored(n) for n in ["op", "_opx", "_private", "key", "lakesync_key", "Note Text", "_Op"]] == [
        "op", "_opx", "_private", "key", "lakesync_key", "Note Text", "_Op"]
    names = ["_op", "__op", "___op", "_lsn", "__lsn", "_lakesync_", "__lakesync_", "x", "_x", "__x"]
    taken = [mirrored(n) for n in names]
    assert len(set(taken)) == len(names)  # no two columns share a name...
    assert not set(taken) & (set(OWN_COLUMNS) | {n for n in taken if n.startswith(WORKING_PREFIX)})  # ...or Lakesync's


def test_a_mirrored_column_is_still_read_by_its_own_name():
    own, renamed = as_mirrored([ColumnType("id", "int", "int", "none"), ColumnType("_op", "string", "string", "none")])
    assert (own.name, own.field) == ("id", "id")
    assert (renamed.name, renamed.field, renamed.ddl()) == ("__op", "_op", "`__op` string")
