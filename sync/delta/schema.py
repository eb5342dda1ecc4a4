"""Schema evolution of a keyed Delta table as its Postgres table changes, with no restart.

The Postgres table's columns arrive with every change event (the envelope's schema), so
each batch compares them with the Delta table's:

- a column added in Postgres is added to the Delta table. Postgres gives the rows that
  existed at the ALTER the column's default without logging a change for them, so when
  Debezium reports a default the rows older than the first event carrying the column
  are given it, whatever the batch boundaries: also when a new mirror's first batch
  (a rebuild from offset zero) holds events from before and after the ALTER. Steps,
  each safe to repeat after a crash:
    1. record the pending backfill (columns, defaults, that first position) as a table
       property `lakesync.backfill` (a new mirror: at its creation);
    2. ADD COLUMNS (a new mirror is created with them);
    3. (the batch is merged by the caller);
    4. `finish_backfill`: UPDATE the rows older than the position to the default, then
       remove the property. A crash anywhere replays the batch, which finds the property
       and finishes the backfill. A volatile default (now(), nextval) is not reported
       by Debezium; such a column stays null in old rows until they change.
- a type Postgres widened (int -> bigint, numeric(10,2) -> numeric(12,2), real ->
  double) is widened in place with Delta's type widening (the table then needs a
  reader that knows the typeWidening feature: Spark with Delta 3.3+, not delta-rs 1.6);
  varchar(n) -> text needs nothing (both are strings here).
- any other type change (text -> int, say) cannot be applied to the existing rows:
  `IncompatibleChange` is raised and the caller stops that table's mirror alone.
- a column renamed or dropped (recorded by migration 0009, sync/cdc/columns.py) is
  renamed or dropped in the Delta table too (`follow_column_changes`), a metadata-only
  change under column mapping: the rows not changed since keep their values under the
  new name.
"""

from __future__ import annotations

import json

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sync.cdc.columns import ColumnChange, precedes
from sync.cdc.decode import convert, mirrored
from sync.cdc.ordering import Position, newer_than_literal, parse_sequence, position_columns
from sync.cdc.types import ColumnType, quoted
from sync.delta.merge import ensure_table, table_properties

# Delta's column mapping by name: a mirror then takes any column name Postgres allows
# (without it Delta refuses spaces, commas, parentheses, braces, `;` and `=`). A mirror made
# before it is given it on its first new column.
COLUMN_MAPPING = {"delta.columnMapping.mode": "name"}
BACKFILL_PROPERTY = "lakesync.backfill"
COLUMN_CHANGES_PROPERTY = "lakesync.column_changes_at"  # source position of the latest column change followed
TYPE_WIDENING_PROPERTY = "delta.enableTypeWidening"
_INTEGRAL = ["tinyint", "smallint", "int", "bigint"]


class IncompatibleChange(Exception):
    """A column's type changed in a way the existing Delta rows cannot follow."""


def sql_string(value: str) -> str:
    """A Spark SQL string literal of `value` (it may hold any column name)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta's type widening can turn `old` into `new` without loss."""
    o, n = old.simpleString(), new.simpleString()
    if o in _INTEGRAL and n in _INTEGRAL:
        return _INTEGRAL.index(n) > _INTEGRAL.index(o)
    if (o, n) == ("float", "double"):
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return False


def evolve(spark: SparkSession, path: str, columns: list[ColumnType], provenance_ddl: str,
           records: DataFrame, properties: dict[str, str]) -> tuple[DeltaTable, dict[str, str]]:
    """The Delta table at `path`, brought to the batch's columns (steps 1-2 above), and
    its table properties as they were before this batch.

    `records` are this table's Kafka records in the batch (to find where a new column
    first appears)."""
    ddl = ", ".join([c.ddl() for c in columns] + [provenance_ddl])
    if not DeltaTable.isDeltaTable(spark, path):
        properties = {**COLUMN_MAPPING, **properties}
        pending = _backfill_of_new_table(records, [c for c in columns if c.default is not None])
        if pending:
            properties[BACKFILL_PROPERTY] = pending
        return ensure_table(spark, path, ddl, properties), properties
    table = DeltaTable.forPath(spark, path)
    recorded = table_properties(spark, path)
    present = {f.name: f.dataType for f in table.toDF().schema.fields}
    wanted = {f.name: f.dataType for f in spark.createDataFrame([], ddl).schema.fields}
    changed = [name for name, kind in wanted.items() if name in present and present[name] != kind]
    for name in changed:
        if not widens(present[name], wanted[name]):
            raise IncompatibleChange(
                f"column {name} changed type from {present[name].simpleString()} to "
                f"{wanted[name].simpleString()}, which the existing rows cannot take")
    if changed:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{TYPE_WIDENING_PROPERTY}' = 'true')")
        for name in changed:
            spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN {quoted(name)} TYPE {wanted[name].simpleString()}")
    added = [c for c in columns if c.name not in present]
    with_default = [c for c in added if c.default is not None]
    if with_default:
        recorded[BACKFILL_PROPERTY] = _backfill(records, with_default)
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                  f"('{BACKFILL_PROPERTY}' = {sql_string(recorded[BACKFILL_PROPERTY])})")
    if added:
        _with_column_mapping(spark, path, recorded)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({', '.join(c.ddl() for c in added)})")
    if added or changed:
        table = DeltaTable.forPath(spark, path)
    return table, recorded


def column_changes_followed(properties: dict[str, str]) -> Position | None:
    """The position of the latest column change the table has followed (None: none)."""
    return parse_sequence(properties.get(COLUMN_CHANGES_PROPERTY))


def column_changes_property(position: Position) -> dict[str, str]:
    return {COLUMN_CHANGES_PROPERTY: json.dumps([str(position[0]), str(position[1])])}


def follow_column_changes(spark: SparkSession, path: str, changes: list[ColumnChange], also: list[str]) -> None:
    """Rename or drop the columns of the Delta table at `path` as `changes` did in
    Postgres, each change not followed yet, in order, then record it (table property
    COLUMN_CHANGES_PROPERTY). Each step is safe to repeat after a crash: it acts only
    while the old column is there. A rename whose new name the table already has (its
    records came before the change's record, and added it as a new column) copies the
    old column into it for the rows older than the rename, then drops the old one.
    `also`: Delta tables keyed like it (the tombstones), whose key columns are renamed
    with it. `changes` name the columns as Postgres does; the mirror as `mirrored`."""
    if not DeltaTable.isDeltaTable(spark, path):
        return
    properties = table_properties(spark, path)
    followed = column_changes_followed(properties)
    pending = [change for change in changes if followed is None or change.at > followed]
    if pending:
        _with_column_mapping(spark, path, properties)
    table = f"delta.`{path}`"
    for change in pending:
        old, new = mirrored(change.old), None if change.new is None else mirrored(change.new)
        present = set(spark.read.format("delta").load(path).columns)
        if old in present:
            if new is None:
                spark.sql(f"ALTER TABLE {table} DROP COLUMN {quoted(old)}")
            elif new not in present:
                spark.sql(f"ALTER TABLE {table} RENAME COLUMN {quoted(old)} TO {quoted(new)}")
            else:
                older = precedes(F.col("_commit_lsn"), F.col("_lsn"), change.at)
                DeltaTable.forPath(spark, path).update(older, {quoted(new): F.col(quoted(old))})
                spark.sql(f"ALTER TABLE {table} DROP COLUMN {quoted(old)}")
        for other in also:
            if new is not None and DeltaTable.isDeltaTable(spark, other):
                columns = set(spark.read.format("delta").load(other).columns)
                if old in columns and new not in columns:
                    _with_column_mapping(spark, other)
                    spark.sql(f"ALTER TABLE delta.`{other}` RENAME COLUMN {quoted(old)} TO {quoted(new)}")
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ("
                  + ", ".join(f"'{k}' = {sql_string(v)}" for k, v in column_changes_property(change.at).items()) + ")")


def _with_column_mapping(spark: SparkSession, path: str, properties: dict[str, str] | None = None) -> None:
    """Column mapping by name, which renames, drops and names such as "Note Text" need (a
    mirror made before it had none). `properties`: the table's, if at hand."""
    properties = table_properties(spark, path) if properties is None else properties
    if any(properties.get(key) != value for key, value in COLUMN_MAPPING.items()):
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                  + "(" + ", ".join(f"'{k}' = '{v}'" for k, v in COLUMN_MAPPING.items()) + ")")


def finish_backfill(spark: SparkSession, path: str, columns: list[ColumnType],
                    properties: dict[str, str]) -> None:
    """Step 4: give rows that predate an added column its default, then forget the task.
    `properties` are the table's, as `evolve` returned them."""
    pending = properties.get(BACKFILL_PROPERTY)
    if not pending:
        return
    table = DeltaTable.forPath(spark, path)
    task = json.loads(pending)
    by_name = {c.name: c for c in columns}
    values = {}
    for name, default in task["defaults"].items():
        column = by_name.get(name)
        if column is not None:
            parsed = F.from_json(F.lit(json.dumps({"v": json.loads(default)})), f"struct<v: {column.json_type}>")
            values[quoted(name)] = convert(parsed["v"], column)
    if values:
        older = f"NOT {newer_than_literal(tuple(task['before']))} AND NOT " \
                f"(_commit_lsn = {int(task['before'][0])} AND _lsn = {int(task['before'][1])})"
        table.update(condition=older, set=values)
    spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('{BACKFILL_PROPERTY}')")


def _backfill(records: DataFrame, with_default: list[ColumnType]) -> str:
    """The pending backfill of columns added with a default (step 1), as recorded."""
    first = _first_position_carrying(records, [c.field for c in with_default])
    return json.dumps({"before": list(first), "defaults": {c.name: c.default for c in with_default}})


def _backfill_of_new_table(records: DataFrame, with_default: list[ColumnType]) -> str | None:
    """A new mirror whose batch starts before a column was added with a default (a rebuild
    from offset zero, a table created and altered within one batch): the rows whose latest
    change predates the column need its default as much as an old mirror's do. Only the
    batch's first record is read unless it lacks such a column."""
    if not with_default:
        return None
    first = records.where(F.col("value").isNotNull()).orderBy("offset").select(
        F.get_json_object(F.col("value").cast("string"), "$.schema").alias("schema")).first()
    if first is None or first["schema"] is None:
        return None
    fields = json.loads(first["schema"]).get("fields", [])
    after = next((f.get("fields", []) for f in fields if f.get("field") == "after"), [])
    carried = {f.get("field") for f in after}
    missing = [c for c in with_default if c.field not in carried]
    return _backfill(records, missing) if missing else None


def _first_position_carrying(records: DataFrame, names: list[str]) -> tuple[int, int]:
    """The earliest source position among records whose row schema has all `names`."""
    schema = "struct<schema: struct<fields: array<struct<field: string, fields: array<struct<field: string>>>>>>"
    parsed = F.from_json(F.col("value").cast("string"), schema)
    after = F.filter(parsed["schema"]["fields"], lambda f: f["field"] == "after")[0]["fields"]
    carried = F.transform(after, lambda f: f["field"])
    commit_lsn, lsn = position_columns(F.get_json_object(F.col("value").cast("string"), "$.payload.source.sequence"))
    has_all = F.lit(True)
    for name in names:
        has_all = has_all & F.array_contains(carried, name)
    row = (records.where(F.col("value").isNotNull() & has_all)
           .select(F.min(F.struct(commit_lsn.alias("c"), lsn.alias("l"))).alias("p")).first())
    if row is None or row["p"] is None or row["p"]["l"] is None:
        raise IncompatibleChange(f"cannot find the first event carrying the new column(s) {names}")
    return int(row["p"]["c"]), int(row["p"]["l"])
