"""Decode Debezium JSON change events (as read from Kafka) into typed Spark columns.

One row per Kafka record in, one row per change out: the table's columns converted
exactly (sync/cdc/types.py), plus the provenance columns every projection row carries
(docs/mirrors.md). Tombstones (null values, written after deletes for compaction)
carry no change and are left out here.

Unchanged TOASTed values: when an update leaves a large (TOASTed) value untouched,
Postgres does not log it and Debezium sends a placeholder instead. Such a value is
decoded as null and its column is named in `_unchanged`, so the merge keeps what the
target already holds; the placeholder itself is never stored. Under REPLICA IDENTITY
FULL the change's old row carries the value (Postgres logs it whole): it is taken from
there instead.

Nothing is applied by guess: a record that is not a change event, has no source
position, or holds a value its column cannot take exactly (a NaN in numeric(p,s), a
malformed timestamp) is decoded with `_error` set, and the projection sends it to the
dead letters instead of applying it (sync/delta/deadletters.py).
"""

from __future__ import annotations

import base64
from dataclasses import replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sync.cdc.columns import precedes
from sync.cdc.ordering import Position, position_columns
from sync.cdc.types import ColumnType, quoted
from sync.streaming.spark import expressions

SOURCE_STRUCT = ("struct<sequence: string, lsn: bigint, txId: bigint, ts_us: bigint, "
                 "snapshot: string, schema: string, table: string>")

PROVENANCE = ["_commit_lsn", "_lsn", "_txid", "_source_ts", "_op", "_topic", "_partition", "_offset"]
UNCHANGED = "_unchanged"  # array<string>: columns whose value this change did not carry
ERROR = "_error"  # string: why this record cannot be applied (null when it can)
BEFORE = "_before"  # struct of the table's columns: the old row of an update (decode_changes(before=True))
OPS = ("c", "u", "d", "r", "t")
UNAVAILABLE = "__debezium_unavailable_value"  # Debezium's default unavailable.value.placeholder
UNAVAILABLE_BASE64 = base64.b64encode(UNAVAILABLE.encode()).decode()  # the same in a bytea column
KEYLESS_KEY_SCHEMA = "io.lakesync.KeylessRowKey"  # the key jvm/smt KeyKeylessRecords gives a keyless change
# The columns Lakesync puts beside a table's own, in its mirror or on the way there, and the
# prefix of every other column it adds while it works (sync/delta/*).
OWN_COLUMNS = frozenset([*PROVENANCE, "_applied_at", UNCHANGED, ERROR, BEFORE])
WORKING_PREFIX = "_lakesync_"


def mirrored(name: str) -> str:
    """A table's column's name in its mirror: its own, unless Lakesync's columns could take
    it. Such a name (one of OWN_COLUMNS, or starting with WORKING_PREFIX, with any number of
    further leading underscores) gets one underscore more: `_op` is mirrored as `__op`,
    `__op` as `___op`. So no two columns share a name and none is taken for Lakesync's."""
    bare = "_" + name.lstrip("_")
    if name.startswith("_") and (bare in OWN_COLUMNS or bare.startswith(WORKING_PREFIX)):
        return "_" + name
    return name


def as_mirrored(columns: list[ColumnType]) -> list[ColumnType]:
    """`columns` under their names in the mirror, each still read by its own (`field`)."""
    return [replace(c, name=mirrored(c.name), source_name=c.field) for c in columns]


def is_keyless(key: Column) -> Column:
    """Whether a Kafka record key (JSON bytes) is not a primary key but the one a change of a
    table without a primary key was given on its way to the compacted topic."""
    return F.coalesce(F.get_json_object(key.cast("string"), "$.schema.name") == KEYLESS_KEY_SCHEMA, F.lit(False))


def placeholder(column: ColumnType) -> Column | None:
    """How an unavailable value of this column appears in the parsed JSON, if it can: the
    placeholder text (base64 in a bytea column); in a text-like array a one-element array
    of it, in an int or bigint array its bytes (Debezium's DBZ-4941, DBZ-5936)."""
    if column.json_type == "string":
        return F.lit(UNAVAILABLE_BASE64 if column.convert == "base64" else UNAVAILABLE)
    element = column.element
    if column.convert == "array" and element is not None:
        if element.json_type == "string" and element.convert != "base64":
            return F.array(F.lit(UNAVAILABLE))
        if element.json_type in ("int", "bigint"):
            return F.array(*[F.lit(b).cast(element.json_type) for b in UNAVAILABLE.encode()])
    return None


def convert(value: Column, column: ColumnType) -> Column:
    """The Delta value of one column from its parsed JSON value; null where the value
    cannot be converted exactly (the caller turns that into an error, never a silent null)."""
    kind = column.convert
    if kind in ("none", "decimal"):
        return value.try_cast(column.delta_type)
    if kind == "numeric_text":  # Debezium's names for numeric's special values
        return (F.when(value == "NAN", "NaN").when(value == "POSITIVE_INFINITY", "Infinity")
                .when(value == "NEGATIVE_INFINITY", "-Infinity").otherwise(value))
    if kind == "timestamptz":
        return F.try_to_timestamp(value)
    if kind == "micros_ntz":
        return F.timestamp_micros(value).cast("timestamp_ntz")
    if kind == "millis_ntz":
        return F.timestamp_millis(value).cast("timestamp_ntz")
    if kind == "nanos_ntz":
        return F.timestamp_micros(F.floor(value / 1000)).cast("timestamp_ntz")
    if kind == "epoch_days":
        return F.date_from_unix_date(value)
    if kind in ("micros_time", "millis_time", "nanos_time"):
        micros = {"micros_time": value, "millis_time": value * 1000, "nanos_time": F.floor(value / 1000)}[kind]
        return F.date_format(F.timestamp_micros(micros), "HH:mm:ss.SSSSSS")
    if kind == "base64":
        return F.try_to_binary(value, F.lit("base64"))
    if kind == "array":
        assert column.element is not None
        return F.transform(value, lambda element: convert(element, column.element))
    raise ValueError(f"column {column.name!r}: unknown conversion {kind!r}")


def row_struct(columns: list[ColumnType]) -> str:
    return "struct<" + ", ".join(f"{quoted(c.field)}: {c.json_type}" for c in columns) + ">"


def decode_changes(records: DataFrame, columns: list[ColumnType], before: bool = False,
                   earlier: dict[str, list[tuple[Position, str | None]]] | None = None) -> DataFrame:
    """Kafka records of one table -> typed change rows with provenance.

    The row image is `after` for c/u/r and `before` for d (it holds the key); a
    truncate (op t) has neither and keeps only its provenance. With `before`, the old
    row is also decoded, into the struct column `_before` (null where the change has
    none): a table without a key finds the row an update replaces by it. `earlier`: per
    column (by its name in the mirror), the names it had in the events before the renames
    after some of the records (sync/cdc/columns.py `earlier_names`), so each record's
    value is read under the name it was written with.
    """
    renames = tuple((name, tuple(names)) for name, names in sorted((earlier or {}).items()))
    envelope, decoded = _decoding(tuple(columns), before, renames)
    parsed = (records.where(F.col("value").isNotNull())
              .select(F.from_json(F.col("value").cast("string"), envelope).alias("e"),
                      "topic", "partition", "offset"))
    return parsed.select(*decoded)


@expressions
def _decoding(columns: tuple[ColumnType, ...], before: bool,
              renames: tuple[tuple[str, tuple[tuple[Position, str | None], ...]], ...]) -> tuple[str, tuple[Column, ...]]:
    """decode_changes' envelope (its parse schema) and output columns, which depend on the
    table's columns alone."""
    columns, earlier = list(columns), dict(renames)
    # Parsed too: each older name, as its column's type (a current column's name is parsed as that column).
    older = {name: replace(c, name=name, source_name=None)
             for c in columns for _, name in earlier.get(c.name, []) if name is not None}
    row = row_struct(columns + [c for name, c in older.items() if name not in {c.field for c in columns}])
    envelope = (f"struct<payload: struct<before: {row}, after: {row}, source: {SOURCE_STRUCT}, "
                f"op: string>>")
    image = F.coalesce(F.col("e.payload.after"), F.col("e.payload.before"))
    commit_lsn, lsn = position_columns(F.col("e.payload.source.sequence"))

    def field(row_image: Column, column: ColumnType) -> Column:
        """The column's value in a row image, under the name the record gave it."""
        value = row_image[column.field]
        for at, name in earlier.get(column.name, []):  # newest first: each wraps the later ones
            value = F.when(precedes(commit_lsn, lsn, at), row_image[name] if name is not None else F.lit(None)
                           ).otherwise(value)
        return value

    values, unavailable, failed = [], [], []
    for c in columns:
        raw, missing = field(image, c), placeholder(c)
        value = convert(raw, c)
        if missing is not None:
            old = field(F.col("e.payload.before"), c)
            carried_by_old = (raw == missing) & old.isNotNull() & (old != missing)
            value = F.when(carried_by_old, convert(old, c)).when(raw == missing, None).otherwise(value)
            unavailable.append(F.when((raw == missing) & ~carried_by_old, F.lit(c.name)))
        values.append(value.alias(c.name))
        failed.append(F.when(raw.isNotNull() & value.isNull() & ~_is(raw, missing),
                             F.lit(f"column {c.name}: value not representable as {c.delta_type}")))
    unchanged = F.array_compact(F.array(*unavailable)) if unavailable else F.array().cast("array<string>")
    op = F.col("e.payload.op")
    error = F.coalesce(
        F.when(F.col("e.payload").isNull(), F.lit("not a Debezium change event")),
        F.when(~op.isin(*OPS) | op.isNull(), F.concat(F.lit("unknown operation "), F.coalesce(op, F.lit("null")))),
        F.when(lsn.isNull(), F.lit("missing or malformed source position (source.sequence)")),
        F.when(op.isin("c", "u", "r") & F.col("e.payload.after").isNull(), F.lit("change without an after image")),
        F.when((op == "d") & F.col("e.payload.before").isNull(), F.lit("delete without a before image")),
        *failed)
    return envelope, (
        *values,
        commit_lsn.alias("_commit_lsn"),
        lsn.alias("_lsn"),
        F.col("e.payload.source.txId").alias("_txid"),
        F.timestamp_micros(F.col("e.payload.source.ts_us")).alias("_source_ts"),
        F.col("e.payload.op").alias("_op"),
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        unchanged.alias(UNCHANGED),
        error.alias(ERROR),
        *([F.when(F.col("e.payload.before").isNotNull(), F.struct(*[
            convert(field(F.col("e.payload.before"), c), c).alias(c.name) for c in columns])).alias(BEFORE)]
          if before else []),
    )


def _is(raw: Column, missing: Column | None) -> Column:
    return F.lit(False) if missing is None else F.coalesce(raw == missing, F.lit(False))
