"""Debezium field schemas (JSON converter, `column.propagate.source.type` on) to Delta types.

Exactness rules:
- numeric(p,s) arrives as a string (decimal.handling.mode=string) and becomes
  decimal(p,s). A numeric Spark cannot hold exactly (unconstrained, or more than 38
  digits) stays a string, never a float: losing digits silently is worse than a type.
  Its special values arrive as NAN / POSITIVE_INFINITY / NEGATIVE_INFINITY and are
  stored as Postgres writes them: NaN, Infinity, -Infinity.
- timestamptz arrives as ISO-8601 UTC text and becomes a UTC timestamp (microseconds);
  timestamp without zone arrives as epoch microseconds and becomes timestamp_ntz.
- date is days since the epoch; time is microseconds since midnight, kept as
  'HH:MM:SS.ffffff' text (Spark has no stable TIME type in 4.2).
- bytea arrives base64-encoded and becomes binary; json/jsonb stay JSON text.

Each column is described by how to parse it out of the JSON payload (`json_type`), what
Delta stores (`delta_type`) and the conversion between them (`convert`), so the
conversion is data for the decoder rather than code per table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

SPARK_MAX_PRECISION = 38

# Connect primitive type, as Kafka's JsonConverter names it in a schema -> Spark SQL type,
# where the value needs no conversion (JsonConverter writes FLOAT32/FLOAT64 as float/double).
PRIMITIVES = {
    "boolean": "boolean",
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float": "float",
    "double": "double",
    "string": "string",
    "bytes": "string",  # base64 in JSON; converted below
}

# Debezium semantic type names (the field schema's "name") that need a conversion.
SEMANTIC = {
    "io.debezium.time.ZonedTimestamp": ("string", "timestamp", "timestamptz"),
    "io.debezium.time.MicroTimestamp": ("bigint", "timestamp_ntz", "micros_ntz"),
    "io.debezium.time.Timestamp": ("bigint", "timestamp_ntz", "millis_ntz"),
    "io.debezium.time.NanoTimestamp": ("bigint", "timestamp_ntz", "nanos_ntz"),
    "io.debezium.time.Date": ("int", "date", "epoch_days"),
    "io.debezium.time.MicroTime": ("bigint", "string", "micros_time"),
    "io.debezium.time.Time": ("int", "string", "millis_time"),
    "io.debezium.time.NanoTime": ("bigint", "string", "nanos_time"),
    "io.debezium.time.ZonedTime": ("string", "string", "none"),
    "io.debezium.time.MicroDuration": ("bigint", "bigint", "none"),
    "io.debezium.data.Json": ("string", "string", "none"),
    "io.debezium.data.Uuid": ("string", "string", "none"),
    "io.debezium.data.Enum": ("string", "string", "none"),
    "io.debezium.data.Xml": ("string", "string", "none"),
    "io.debezium.data.Bits": ("string", "binary", "base64"),
}

NUMERIC_SOURCE_TYPES = {"NUMERIC", "DECIMAL", "MONEY"}


@dataclass(frozen=True)
class ColumnType:
    name: str               # the column's name in Delta
    json_type: str          # Spark DDL type used to parse the value out of the JSON text
    delta_type: str         # Spark DDL type stored in the Delta table
    convert: str            # conversion from json_type to delta_type (see sync/cdc/decode.py)
    nullable: bool = True
    element: "ColumnType | None" = None  # arrays: how each element converts
    default: str | None = None  # the column's default as JSON text, when Debezium reports one
    source_name: str | None = None  # its name in the change events, where Delta's differs (sync/cdc/decode.py `mirrored`)

    @property
    def field(self) -> str:
        """The column's name in the change events' row images."""
        return self.source_name or self.name

    def ddl(self) -> str:
        return f"{quoted(self.name)} {self.delta_type}"


def quoted(name: str) -> str:
    """A column name as a Spark SQL identifier: any name Postgres allows (spaces, dots,
    quotes, non-ASCII) in backticks, a backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def columns(names: list[str]) -> list[Column]:
    """Spark columns by these names, taken whole (a dot in a name is not a struct field)."""
    return [F.col(quoted(name)) for name in names]


def column_type(field: dict[str, Any]) -> ColumnType:
    """Map one Debezium field schema (an entry of the Value schema's `after` fields)."""
    column = _column_type(field)
    if field.get("default") is not None:
        column = replace(column, default=json.dumps(field["default"]))
    return column


def _column_type(field: dict[str, Any]) -> ColumnType:
    name = field.get("field", "")
    nullable = bool(field.get("optional", True))
    kind = field.get("type")
    semantic = field.get("name")
    params = field.get("parameters") or {}
    source_type = params.get("__debezium.source.column.type", "").upper()

    if kind == "array":
        element = column_type({**field["items"], "field": "element"})
        return ColumnType(name, f"array<{element.json_type}>", f"array<{element.delta_type}>",
                          "array", nullable, element)
    if kind in ("struct", "map"):
        # Geometries, maps and other structured values: kept as their JSON text, not guessed at.
        return ColumnType(name, "string", "string", "none", nullable)
    if semantic == "io.debezium.data.VariableScaleDecimal" or (
            kind == "string" and source_type in NUMERIC_SOURCE_TYPES):
        return _decimal(name, params, source_type, nullable)
    if semantic in SEMANTIC:
        json_type, delta_type, convert = SEMANTIC[semantic]
        return ColumnType(name, json_type, delta_type, convert, nullable)
    if kind == "bytes":
        return ColumnType(name, "string", "binary", "base64", nullable)
    if kind in PRIMITIVES:
        spark = PRIMITIVES[kind]
        return ColumnType(name, spark, spark, "none", nullable)
    raise ValueError(f"column {name!r}: unsupported Debezium schema type {kind!r}")


def _decimal(name: str, params: dict[str, str], source_type: str, nullable: bool) -> ColumnType:
    if source_type == "MONEY":
        return ColumnType(name, "string", "decimal(19,2)", "decimal", nullable)
    precision = int(params.get("__debezium.source.column.length", "0") or 0)
    scale = int(params.get("__debezium.source.column.scale", "0") or 0)
    # Postgres reports an unconstrained numeric as length 0 (or 131089).
    if 0 < precision <= SPARK_MAX_PRECISION and 0 <= scale <= precision:
        return ColumnType(name, "string", f"decimal({precision},{scale})", "decimal", nullable)
    return ColumnType(name, "string", "string", "numeric_text", nullable)


def table_columns(value_schema: dict[str, Any]) -> list[ColumnType]:
    """Columns of a table from a change event's Value schema (its `after`, else `before`)."""
    fields = {f["field"]: f for f in value_schema.get("fields", [])}
    row = fields.get("after") or fields.get("before")
    if row is None:
        raise ValueError("not a Debezium envelope schema: no before/after fields")
    return [column_type(f) for f in row["fields"]]


def key_columns(key_schema: dict[str, Any]) -> list[str]:
    return [f["field"] for f in key_schema.get("fields", [])]

