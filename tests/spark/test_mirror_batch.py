"""The mirror's batch function on real Spark and Delta, fed hand-made Debezium records.

No Kafka here: each test builds the rows the Kafka source would hand to foreachBatch
(key, value, topic, partition, offset), so ordering, the newer-than guard, deletes,
truncates and idempotent replays are tested on exact inputs.
"""

import dataclasses
import json
from pathlib import Path
from urllib.parse import urlparse
from decimal import Decimal

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from projections import changelog, mirrors
from sync import config
from sync.bench import merge_scaling
from sync.commands import snapshot
from sync.cdc.decode import KEYLESS_KEY_SCHEMA, UNAVAILABLE
from sync.delta import catalog, deadletters, fencing, points, reader
from sync.delta.merge import ensure_table, latest_version
from sync.errors import Fenced
from sync.stack.capture import NEXT_BATCH_ROW
from sync.streaming import batch as batch_function
from tests.delta_readers import duckdb_rows, reader_features, spark_rows

pytestmark = pytest.mark.spark

TOPIC = "lakesync.public.widgets"
FIELDS = merge_scaling.FIELDS  # id bigint, name text, price numeric(12,2), seen_at timestamptz
ROW_SCHEMA = {"type": "struct", "fields": FIELDS, "optional": True}
VALUE_SCHEMA = {"type": "struct", "fields": [{**ROW_SCHEMA, "field": "before"}, {**ROW_SCHEMA, "field": "after"},
                                             {"type": "struct", "field": "source", "fields": []},
                                             {"type": "string", "field": "op"}]}
KEY_SCHEMA = {"type": "struct", "fields": [FIELDS[0]], "optional": False}


def event(op, key, commit, lsn, name=None, price=None, seen_at="2024-03-31T01:30:00.123456Z"):
    row = None if op in ("d", "t") else {"id": key, "name": name, "price": price, "seen_at": seen_at}
    before = {"id": key, "name": None, "price": None, "seen_at": None} if op == "d" else None
    value = {"schema": VALUE_SCHEMA, "payload": {
        "before": before, "after": row, "op": op,
        "source": {"sequence": json.dumps([str(commit) if commit is not None else None, str(lsn)]),
                   "lsn": lsn, "txId": commit or 1, "ts_us": 1711848600123456}}}
    kafka_key = None if op == "t" else json.dumps({"schema": KEY_SCHEMA, "payload": {"id": key}}).encode()
    return kafka_key, json.dumps(value).encode()


def batch(spark, events, first_offset=0):
    """The Kafka source's rows for `events`: (key, value) or (key, value, headers)."""
    rows = [(e[0], e[1], TOPIC, 0, first_offset + i, e[2] if len(e) > 2 else None) for i, e in enumerate(events)]
    return spark.createDataFrame(rows, mirrors.RECORDS_DDL)


@pytest.fixture
def settings(tmp_path, request):
    """A lake in a directory; in a bucket of the tests' S3 server for a test parametrized
    `settings` = "bucket" (sync/lake.py)."""
    where = request.getfixturevalue("bucket_lake") if getattr(request, "param", "") == "bucket" else tmp_path / "lake"
    return dataclasses.replace(config.load(), lake=where)


def new_batch(spark, settings, column_history=None):
    """The mirrors' batch function; `column_history`: what the column changes' topic holds
    (sync/cdc/columns.py), none unless given."""
    return mirrors.MirrorBatch(settings, fencing.take(spark, settings, mirrors.NAME, []),
                               lambda: column_history or {})


def mirror(spark, settings):
    path = str(mirrors.mirror_path(settings, "widgets"))
    return {r["id"]: r for r in spark.read.format("delta").load(path).collect()}


def test_latest_change_per_key_wins_whatever_the_arrival_order(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, None, 10, "snap", "1.00"),
                        event("u", 1, 300, 320, "third", "3.00"),
                        event("u", 1, 100, 120, "first", "1.50"),
                        event("u", 1, 200, 210, "second", "2.00")]), 0)
    rows = mirror(spark, settings)
    assert rows[1]["name"] == "third" and rows[1]["price"] == Decimal("3.00")
    assert (rows[1]["_commit_lsn"], rows[1]["_lsn"]) == (300, 320)


def test_an_older_change_never_overwrites_a_newer_row(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 500, 510, "new", "5.00")]), 0)
    apply(batch(spark, [event("u", 1, 400, 410, "stale", "4.00"),      # redelivered, older
                        event("u", 1, 500, 510, "new-dup", "5.00")], 1), 1)  # same position
    assert mirror(spark, settings)[1]["name"] == "new"


def test_delete_then_reinsert_and_delete_of_unknown_key(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a", "1.00"), event("c", 2, 10, 12, "b", "2.00")]), 0)
    apply(batch(spark, [event("d", 1, 20, 21), event("c", 1, 30, 31, "again", "1.10"),
                        event("d", 2, 20, 22), event("d", 3, 20, 23)], 2), 1)
    rows = mirror(spark, settings)
    assert set(rows) == {1} and rows[1]["name"] == "again"


def test_exact_types(spark, settings):
    new_batch(spark, settings)(batch(spark, [event("c", 7, 10, 11, "t", "1234567890.12",
                                                      seen_at="1969-07-20T20:17:40.000001Z")]), 0)
    row = mirror(spark, settings)[7]
    assert row["price"] == Decimal("1234567890.12")
    assert row["seen_at"].isoformat() == "1969-07-20T20:17:40.000001"


def test_truncate_removes_older_rows_and_keeps_later_ones(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), 0)
    apply(batch(spark, [event("t", None, 20, 21), event("c", 3, 30, 31, "after")], 2), 1)
    assert set(mirror(spark, settings)) == {3}


def test_a_replayed_batch_is_a_noop(spark, settings):
    """Crash after the Delta commit, before Spark's: the same batch id comes again."""
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "first")]), 5)
    path = str(mirrors.mirror_path(settings, "widgets"))
    version = DeltaTable.forPath(spark, path).history(1).first()["version"]
    # Same batch id, content that would otherwise apply (newer position): skipped.
    apply(batch(spark, [event("u", 1, 20, 21, "replayed")]), 5)
    assert DeltaTable.forPath(spark, path).history(1).first()["version"] == version
    assert mirror(spark, settings)[1]["name"] == "first"
    apply(batch(spark, [event("u", 1, 20, 21, "next")]), 6)
    assert mirror(spark, settings)[1]["name"] == "next"


def test_a_new_mirrors_first_batch_is_appended_and_its_replay_changes_nothing(spark, settings):
    """A table with no rows has nothing to match: the latest changes that are not deletes are
    appended. The batch's replay finds rows, MERGEs, and is skipped as already applied."""
    apply = new_batch(spark, settings)
    path = str(mirrors.mirror_path(settings, "widgets"))
    first = [event("c", 1, 10, 11, "a", "1.00"), event("u", 1, 10, 12, "a2", "1.50"),
             event("c", 2, 10, 13, "b", "2.00"), event("d", 2, 10, 14), event("d", 3, 10, 15)]
    apply(batch(spark, first), 0)
    last = DeltaTable.forPath(spark, path).history(1).first()
    assert last["operation"] == "WRITE" and last["operationMetrics"]["numOutputRows"] == "1"
    rows = mirror(spark, settings)
    assert set(rows) == {1} and rows[1]["name"] == "a2" and rows[1]["price"] == Decimal("1.50")
    apply(batch(spark, first), 0)
    assert DeltaTable.forPath(spark, path).history(1).first()["version"] == last["version"]
    apply(batch(spark, [event("u", 1, 20, 21, "later", "3.00")], 5), 1)
    assert DeltaTable.forPath(spark, path).history(1).first()["operation"] == "MERGE"
    assert mirror(spark, settings)[1]["name"] == "later"


def test_tombstones_are_ignored(spark, settings):
    apply = new_batch(spark, settings)
    key, _ = event("c", 1, 10, 11, "a")
    apply(batch(spark, [event("c", 1, 10, 11, "a"), (key, None)]), 0)
    assert mirror(spark, settings)[1]["name"] == "a"


def test_unchanged_toasted_value_keeps_what_the_target_holds(spark, settings):
    """Debezium sends a placeholder for a TOASTed value an update did not touch."""
    apply = new_batch(spark, settings)
    unavailable = "__debezium_unavailable_value"
    apply(batch(spark, [event("c", 1, 10, 11, "long text", "1.00")]), 0)
    apply(batch(spark, [event("u", 1, 20, 21, unavailable, "2.00")], 1), 1)
    # Within one batch: the insert carries the value, the later update does not.
    apply(batch(spark, [event("c", 2, 30, 31, "inserted text", "1.00"),
                        event("u", 2, 30, 32, unavailable, "3.00")], 2), 2)
    rows = mirror(spark, settings)
    assert rows[1]["name"] == "long text" and rows[1]["price"] == Decimal("2.00")
    assert rows[2]["name"] == "inserted text" and rows[2]["price"] == Decimal("3.00")
    assert unavailable not in {r["name"] for r in rows.values()}


def test_truncate_of_a_table_never_mirrored_is_a_noop(spark, settings):
    new_batch(spark, settings)(batch(spark, [event("t", None, 20, 21)]), 0)
    assert not DeltaTable.isDeltaTable(spark, str(mirrors.mirror_path(settings, "widgets")))


def test_truncate_only_batch_uses_the_recorded_key(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), 0)
    apply(batch(spark, [event("t", None, 20, 21)], 2), 1)
    assert mirror(spark, settings) == {}


def test_an_older_change_redelivered_after_a_delete_stays_deleted(spark, settings):
    """The delete leaves a tombstone; the mirror holds live rows only."""
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), 0)
    apply(batch(spark, [event("d", 1, 20, 21)], 2), 1)
    apply(batch(spark, [event("u", 1, 15, 16, "redelivered, older than the delete")], 3), 2)
    assert set(mirror(spark, settings)) == {2}
    dead = spark.read.format("delta").load(str(mirrors.tombstone_path(settings, "widgets"))).collect()
    assert [(r["id"], r["_commit_lsn"], r["_lsn"]) for r in dead] == [(1, 20, 21)]
    apply(batch(spark, [event("c", 1, 30, 31, "inserted again, newer")], 4), 3)
    assert mirror(spark, settings)[1]["name"] == "inserted again, newer"


def test_an_older_change_redelivered_to_a_new_run_stays_deleted(spark, settings):
    """A live batch reads no tombstones when its changes all come after the newest one,
    which a new run reads from the table: a redelivered older change still stays out."""
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), 0)
    apply(batch(spark, [event("d", 1, 20, 21)], 2), 1)
    restarted = new_batch(spark, settings)
    restarted(batch(spark, [event("u", 2, 30, 31, "newer")], 3), 2)
    restarted(batch(spark, [event("u", 1, 15, 16, "redelivered, older than the delete"),
                            event("u", 2, 40, 41, "newest")], 4), 3)
    assert {key: row["name"] for key, row in mirror(spark, settings).items()} == {2: "newest"}


def test_a_change_older_than_a_truncate_in_an_earlier_batch_stays_out(spark, settings):
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a")]), 0)
    apply(batch(spark, [event("t", None, 20, 21)], 1), 1)
    apply(batch(spark, [event("u", 1, 15, 16, "redelivered")], 2), 2)
    assert mirror(spark, settings) == {}


def test_records_that_cannot_be_applied_go_to_the_dead_letters(spark, settings):
    apply = new_batch(spark, settings)
    key, value = event("c", 4, 10, 14, "no position")
    positionless = json.loads(value)
    positionless["payload"]["source"]["sequence"] = None
    nan_key, nan_value = event("c", 5, 10, 15, "nan price", "NaN")
    rows = [event("c", 1, 10, 11, "good"),
            (key, b"{not json"),
            (key, json.dumps(positionless).encode()),
            (nan_key, nan_value),
            event("c", 6, 10, 16, "one content"),
            event("c", 6, 10, 16, "another content at the same position"),
            # A snapshot read's position (commit LSN 0) likewise.
            event("r", 7, None, 17, "one snapshot content"),
            event("r", 7, None, 17, "another snapshot content")]
    apply(batch(spark, rows), 0)
    assert set(mirror(spark, settings)) == {1}
    letters = spark.read.format("delta").load(deadletters.path(settings, "mirrors")).collect()
    errors = sorted((r["offset"], r["error"]) for r in letters)
    assert [offset for offset, _ in errors] == [1, 2, 3, 4, 5, 6, 7]
    assert "not a Debezium change event" in errors[0][1]
    assert "source position" in errors[1][1]
    assert "price" in errors[2][1]
    assert all("repeated source position" in error for _, error in errors[3:])
    assert all(r["value"] is not None and r["projection"] == "mirrors" for r in letters)
    # Replaying the batch adds no second copy.
    apply(batch(spark, rows), 0)
    assert spark.read.format("delta").load(deadletters.path(settings, "mirrors")).count() == 7


def test_a_zombie_writer_is_fenced(spark, settings):
    zombie = new_batch(spark, settings)
    zombie(batch(spark, [event("c", 1, 10, 11, "a")]), 0)
    newer = new_batch(spark, settings)  # a second run takes the next epoch
    with pytest.raises(Fenced):
        zombie(batch(spark, [event("u", 1, 20, 21, "zombie")], 1), 1)
    newer(batch(spark, [event("u", 1, 20, 21, "newer run")], 1), 1)
    assert mirror(spark, settings)[1]["name"] == "newer run"


def _change(fields, op, row_id, commit, lsn, **row):
    """A change event of a `widgets` table whose columns are `fields`; a delete's before
    image holds the key alone (REPLICA IDENTITY DEFAULT)."""
    schema = {"type": "struct", "fields": fields, "optional": True}
    after = None if op == "d" else {"id": row_id, **row}
    before = {"id": row_id} if op == "d" else None
    value = {"schema": {"type": "struct", "fields": [{**schema, "field": "before"}, {**schema, "field": "after"},
                                                     {"type": "struct", "field": "source", "fields": []},
                                                     {"type": "string", "field": "op"}]},
             "payload": {"before": before, "after": after, "op": op,
                         "source": {"sequence": json.dumps([str(commit), str(lsn)]), "lsn": lsn, "txId": commit,
                                    "ts_us": 1711848600123456}}}
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": row_id}}).encode(), json.dumps(value).encode()


def _evolved(fields, key, commit, lsn, **row):
    """A create event of a `widgets` table whose columns are `fields`."""
    return _change(fields, "c", key, commit, lsn, **row)


def test_added_column_with_a_default_reaches_older_rows(spark, settings):
    apply = new_batch(spark, settings)
    base = FIELDS[:2]
    apply(batch(spark, [_evolved(base, 1, 10, 11, name="old")]), 0)
    added = base + [{"type": "int32", "optional": True, "default": 7, "field": "stock"},
                    {"type": "string", "optional": True, "field": "note"}]
    apply(batch(spark, [_evolved(base, 2, 20, 21, name="before the alter, same batch"),
                        _evolved(added, 3, 30, 31, name="after", stock=None, note="n")], 1), 1)
    rows = mirror(spark, settings)
    assert (rows[1]["stock"], rows[2]["stock"], rows[3]["stock"]) == (7, 7, None)
    assert (rows[1]["note"], rows[3]["note"]) == (None, "n")
    detail = DeltaTable.forPath(spark, str(mirrors.mirror_path(settings, "widgets"))).detail().first()
    assert "lakesync.backfill" not in detail["properties"]


def test_widened_type_is_applied_and_an_incompatible_one_stops_the_mirror(spark, settings):
    apply = new_batch(spark, settings)
    as_int = [FIELDS[0], {"type": "int32", "optional": True, "field": "qty"}]
    as_bigint = [FIELDS[0], {"type": "int64", "optional": True, "field": "qty"}]
    as_text = [FIELDS[0], {"type": "string", "optional": True, "field": "qty"}]
    apply(batch(spark, [_evolved(as_int, 1, 10, 11, qty=5)]), 0)
    apply(batch(spark, [_evolved(as_bigint, 2, 20, 21, qty=2**40)], 1), 1)
    rows = mirror(spark, settings)
    assert (rows[1]["qty"], rows[2]["qty"]) == (5, 2**40)
    # A reader without Spark reads the widened table (docs/operations.md, "Reading the tables").
    path = str(mirrors.mirror_path(settings, "widgets"))
    version = latest_version(path)
    assert "typeWidening" in reader_features(path)
    assert duckdb_rows(reader.connect(), path, version) == spark_rows(spark, path, version)
    apply(batch(spark, [_evolved(as_text, 3, 30, 31, qty="many")], 2), 2)
    assert set(mirror(spark, settings)) == {1, 2}
    letters = spark.read.format("delta").load(deadletters.path(settings, "mirrors")).collect()
    assert [r["offset"] for r in letters] == [2] and "mirror stopped" in letters[0]["error"]
    assert "stopped" in apply.progress.state["tables"]["widgets"]


ODD_NAMES = ["Note Text", "MixedCase", "a.b", "ünï", "it's", "back`tick", "x,y(z)={};"]


def test_any_column_name_postgres_allows_is_mirrored(spark, settings):
    apply = new_batch(spark, settings)
    text = {"type": "string", "optional": True}
    fields = [FIELDS[0]] + [{**text, "field": n} for n in ODD_NAMES]
    apply(batch(spark, [_evolved(fields, 1, 10, 11, **{n: f"{n}!" for n in ODD_NAMES}),
                        _evolved(fields, 2, 10, 12, **{n: "two" for n in ODD_NAMES})]), 0)
    # Then a MERGE: an update leaving a TOASTed value out, and a new column with a default.
    added = fields + [{"type": "int32", "optional": True, "default": 7, "field": "new 'one'"}]
    changed = {n: "__debezium_unavailable_value" if n == "Note Text" else "changed" for n in ODD_NAMES}
    apply(batch(spark, [_evolved(added, 1, 20, 21, **changed, **{"new 'one'": 8})], 2), 1)
    rows = mirror(spark, settings)
    assert [rows[1][n] for n in ODD_NAMES] == ["Note Text!"] + ["changed"] * (len(ODD_NAMES) - 1)
    assert [rows[2][n] for n in ODD_NAMES] == ["two"] * len(ODD_NAMES)
    assert (rows[1]["new 'one'"], rows[2]["new 'one'"]) == (8, 7)


def test_columns_named_payload_and_schema_holding_envelope_text_are_read_exactly(spark, settings):
    """A row's own `payload` and `schema` are not the envelope's, in the mirrors and the changelog."""
    text = {"type": "string", "optional": True}
    fields = [FIELDS[0], {**text, "field": "payload"}, {**text, "field": "schema"}]
    envelope = '{"schema":{"type":"struct"},"payload":{"op":"d","after":null}}'
    records = batch(spark, [_evolved(fields, 1, 10, 11, payload=envelope, schema=envelope),
                            _change(fields, "u", 1, 20, 21, payload="later", schema=envelope)])
    new_batch(spark, settings)(records, 0)
    row = mirror(spark, settings)[1]
    assert (row["payload"], row["schema"]) == ("later", envelope)
    kafka_records = records.withColumn("timestamp", F.current_timestamp())  # the Kafka source's column too
    logged = changelog.as_changelog(kafka_records).orderBy("_offset").collect()
    assert [row["_op"] for row in logged] == ["c", "u"]
    assert json.loads(logged[0]["after"]) == {"id": 1, "payload": envelope, "schema": envelope}
    assert [(row["_commit_lsn"], row["_lsn"], row["_txid"]) for row in logged] == [(10, 11, 10), (20, 21, 20)]


CLASHING = ["_op", "__op", "_lsn", "_unchanged", "_lakesync_value_0", "key"]  # key: keychanges' working names


def test_columns_named_like_lakesyncs_own_are_mirrored_with_one_more_underscore(spark, settings):
    """A user's `_op` beside the provenance `_op` is mirrored as `__op` (sync/cdc/decode.py
    `mirrored`): through a key change filling a TOASTed value, and a rename to `_txid`."""
    text = {"type": "string", "optional": True}
    fields = [FIELDS[0], NAME] + [{**text, "field": n} for n in CLASHING]
    apply = new_batch(spark, settings)
    apply(batch(spark, [_change(fields, "c", 1, 10, 11, name="one", **{n: f"{n} 1" for n in CLASHING}),
                        _change(fields, "c", 2, 10, 12, name="two", **{n: f"{n} 2" for n in CLASHING})]), 0)
    apply(batch(spark, _key_change(fields, 1, 101, 20, 21, **{n: UNAVAILABLE if n == "_op" else f"{n} moved"
                                                               for n in CLASHING}), 2), 1)
    renamed = [{**f, "field": "_txid"} if f["field"] == "key" else f for f in fields]
    records = [(_column_change("key", "_txid", 30, 31), mirrors.COLUMNS_TOPIC),
               (_change(renamed, "u", 2, 40, 41, name="two, updated", **{("_txid" if n == "key" else n): f"{n} 3"
                                                                        for n in CLASHING}), TOPIC)]
    apply(spark.createDataFrame([(k, v, topic, 0, 4 + i, None) for i, ((k, v), topic) in enumerate(records)],
                                mirrors.RECORDS_DDL), 2)
    rows = mirror(spark, settings)
    names = ["__op", "___op", "__lsn", "__unchanged", "__lakesync_value_0", "__txid"]
    assert {k: [r["name"], *[r[n] for n in names], r["_op"]] for k, r in rows.items()} == {
        101: ["one", "_op 1", *[f"{n} moved" for n in CLASHING[1:]], "c"],
        2: ["two, updated", *[f"{n} 3" for n in CLASHING], "u"]}
    assert "key" not in spark.read.format("delta").load(str(mirrors.mirror_path(settings, "widgets"))).columns


def test_a_mirror_made_without_column_mapping_takes_it_for_a_new_column(spark, settings):
    path = str(mirrors.mirror_path(settings, "widgets"))
    ensure_table(spark, path, f"id bigint, name string, {mirrors.PROVENANCE_DDL}")  # as made before 2026-11-25
    fields = FIELDS[:2] + [{"type": "string", "optional": True, "field": "Note Text"}]
    new_batch(spark, settings)(batch(spark, [_evolved(fields, 1, 10, 11, name="n", **{"Note Text": "spaced"})]), 0)
    assert mirror(spark, settings)[1]["Note Text"] == "spaced"


def test_a_table_spark_or_delta_refuses_stops_alone(spark, settings):
    """Columns only case tells apart (Delta refuses them): the table stops its own mirror,
    and the other table of the batch is applied."""
    apply = new_batch(spark, settings)
    text = {"type": "string", "optional": True}
    refused = {"lakesync.public.cased": [FIELDS[0], {**text, "field": "tag"}, {**text, "field": "Tag"}]}
    rows = [(*event("c", 1, 10, 11, "kept"), TOPIC, 0, 0, None)]
    rows += [(*_evolved(fields, 1, 10, 12, **{f["field"]: "x" for f in fields[1:]}), topic, 0, 0, None)
             for topic, fields in refused.items()]
    apply(spark.createDataFrame(rows, mirrors.RECORDS_DDL), 0)
    apply(batch(spark, [event("c", 2, 20, 21, "still applied")], 1), 1)
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "kept", 2: "still applied"}
    letters = spark.read.format("delta").load(deadletters.path(settings, "mirrors")).collect()
    assert [r["table"] for r in letters] == ["cased"]
    assert all(r["error"].startswith("mirror stopped: ") and "\n" not in r["error"] for r in letters)
    tables = apply.progress.state["tables"]
    assert tables["cased"]["stopped"] and "stopped" not in tables["widgets"]


def test_tombstones_older_than_the_horizon_are_swept(spark, settings):
    """So are the rows saved for a key change whose create is in a later batch."""
    settings = dataclasses.replace(settings, tombstone_hours=0)
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("c", 2, 10, 12, "b")]), 0)
    apply(batch(spark, [event("d", 1, 20, 21), _key_change(FIELDS[:3], 2, 102, 30, 31)[0]], 2), 1)
    for path in (str(mirrors.tombstone_path(settings, "widgets")), str(mirrors.moved_path(settings, "widgets"))):
        assert spark.read.format("delta").load(path).count() == 0
        assert DeltaTable.forPath(spark, path).history(1).first()["operation"] == "DELETE"


def test_a_tombstone_table_younger_than_the_horizon_is_not_swept(spark, settings):
    """Tombstones are swept by write time, so none is older than its table: nothing to delete."""
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", 1, 10, 11, "a"), event("d", 1, 20, 21)]), 0)
    path = str(mirrors.tombstone_path(settings, "widgets"))
    assert spark.read.format("delta").load(path).count() == 1
    assert "DELETE" not in {r["operation"] for r in DeltaTable.forPath(spark, path).history().collect()}


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created_again(spark, settings):
    # What a runner killed inside the first commit leaves (seen in the chaos run): a log
    # with Delta's staging folder and no version, which Delta neither opens nor creates over.
    path = settings.lake / "interrupted"
    (path / "_delta_log" / "_staged_commits").mkdir(parents=True)
    ensure_table(spark, str(path), "id bigint, name string")
    spark.createDataFrame([(1, "a")], "id bigint, name string").write.format("delta").mode("append").save(str(path))
    assert [tuple(r) for r in spark.read.format("delta").load(str(path)).collect()] == [(1, "a")]


def test_deletion_vectors_come_on_once_a_merge_copies_many_rows(spark, settings, monkeypatch):
    """A mirror starts without deletion vectors (a small MERGE is cheaper rewriting files);
    the first MERGE that copies more unchanged rows than the limit turns them on, and the
    rows stay right across the switch."""
    from sync.delta import merge
    from sync.delta.merge import DELETION_VECTORS, table_properties

    path = str(mirrors.mirror_path(settings, "widgets"))
    apply = new_batch(spark, settings)
    apply(batch(spark, [event("c", key, None, key, f"w{key}", "1.00") for key in range(1, 41)]), 0)
    apply(batch(spark, [event("u", 1, 100, 101, "changed", "2.00")], 40), 1)  # copies 39 rows
    assert table_properties(spark, path)[DELETION_VECTORS] == "false"

    monkeypatch.setattr(merge, "COPIED_ROWS_FOR_DELETION_VECTORS", 30)
    apply(batch(spark, [event("u", 2, 200, 201, "changed", "2.00")], 41), 2)  # copies 39 again: above 30
    assert table_properties(spark, path)[DELETION_VECTORS] == "true"
    apply(batch(spark, [event("u", 3, 300, 301, "changed", "2.00"), event("d", 4, 300, 302)], 42), 3)
    rows = mirror(spark, settings)
    assert len(rows) == 39 and 4 not in rows
    assert [rows[k]["name"] for k in (1, 2, 3, 5)] == ["changed", "changed", "changed", "w5"]
    files = DeltaTable.forPath(spark, path).history(1).first()["operationMetrics"]
    # The last MERGE marked the changed rows' old versions; it copied none.
    assert int(files["numTargetDeletionVectorsAdded"]) >= 1 and int(files["numTargetRowsCopied"]) == 0
    # A reader without Spark honours them (docs/operations.md, "Reading the tables").
    version = latest_version(path)
    assert "deletionVectors" in reader_features(path)
    assert duckdb_rows(reader.connect(), path, version) == spark_rows(spark, path, version)


WITH_STOCK = FIELDS[:3] + [{"type": "int32", "optional": True, "default": 7, "field": "stock"}]


def _key_change(fields, old, new, commit, lsn, **row):
    """UPDATE ... SET id = new leaving the TOASTed `name` alone, as Debezium sends it."""
    new_key = [("__debezium.newkey", json.dumps({"id": new}).encode())]
    old_key = [("__debezium.oldkey", json.dumps({"id": old}).encode())]
    return [(*_change(fields, "d", old, commit, lsn), new_key),
            (*_change(fields, "c", new, commit, lsn, name=UNAVAILABLE, **row), old_key)]


# One table's history: creates, a column added with a default, key changes (one of them
# twice in a row, one after an update of its TOASTed value), an update leaving the value
# alone after a key change, a delete. What Postgres holds at its end is EXPECTED.
HISTORY = [
    _change(FIELDS[:3], "c", 1, 10, 11, name="one " * 600, price="1.00"),
    _change(FIELDS[:3], "c", 2, 10, 12, name="two " * 600, price="2.00"),
    _change(FIELDS[:3], "c", 3, 10, 13, name="three", price="3.00"),
    _change(FIELDS[:3], "c", 4, 10, 14, name="four", price="4.00"),
    _change(FIELDS[:3], "c", 5, 10, 15, name="five, never changed", price="5.00"),
    _change(FIELDS[:3], "u", 3, 20, 21, name="three, updated", price="3.50"),
    *_key_change(WITH_STOCK, 1, 101, 30, 31, price="1.00", stock=7),           # after ADD COLUMN stock DEFAULT 7
    *_key_change(WITH_STOCK, 2, 102, 40, 41, price="2.00", stock=7),
    *_key_change(WITH_STOCK, 102, 202, 50, 51, price="2.00", stock=8),
    *_key_change(WITH_STOCK, 3, 103, 60, 61, price="3.50", stock=7),
    _change(WITH_STOCK, "u", 101, 70, 71, name=UNAVAILABLE, price="1.10", stock=9),
    _change(WITH_STOCK, "d", 4, 80, 81),
]
EXPECTED = {101: ("one " * 600, Decimal("1.10"), 9), 202: ("two " * 600, Decimal("2.00"), 8),
            103: ("three, updated", Decimal("3.50"), 7), 5: ("five, never changed", Decimal("5.00"), 7)}


def _mirrored(spark, settings, cuts):
    """The mirror after HISTORY applied in batches split at `cuts` (offsets)."""
    apply = new_batch(spark, settings)
    bounds = [0, *cuts, len(HISTORY)]
    for batch_id, (start, end) in enumerate(zip(bounds, bounds[1:])):
        apply(batch(spark, HISTORY[start:end], start), batch_id)
    return {k: (r["name"], r["price"], r["stock"]) for k, r in mirror(spark, settings).items()}


def test_a_history_of_key_changes_and_an_added_column_in_one_batch_or_split_at_random(spark, settings):
    """A key change keeps the TOASTed value it left alone, and a column added with a default
    holds it in the rows not changed since, whatever the batch boundaries: one batch (a
    rebuild from offset zero), each key change's delete and create in two batches, and
    random cuts (seeded; the seed is in the failure's message)."""
    import random
    assert _mirrored(spark, settings, []) == EXPECTED
    split_pairs = [7, 9, 11, 13]  # between each key change's delete and create
    seed = random.randrange(1 << 30)
    cuts = sorted(random.Random(seed).sample(range(1, len(HISTORY)), 3))
    for n, split in enumerate([split_pairs, cuts]):
        lake = dataclasses.replace(settings, lake=settings.lake.with_name(f"lake{n}"))
        assert _mirrored(spark, lake, split) == EXPECTED, f"cuts {split} (seed {seed})"


KEYLESS_KEY = {"type": "struct", "name": KEYLESS_KEY_SCHEMA, "optional": False,
               "fields": [{"type": "int64", "field": f} for f in ("lsn", "seq", "task_started_ms")]}


def _keyless(op, commit, lsn, seq, before=None, after=None):
    """A change of a `widgets` table without a primary key, as KeyKeylessRecords keys it:
    whole old rows (REPLICA IDENTITY FULL); rows are (id, name, price)."""
    def image(row):
        return None if row is None else {"id": row[0], "name": row[1], "price": row[2], "seen_at": None}
    value = {"schema": VALUE_SCHEMA, "payload": {
        "before": image(before), "after": image(after), "op": op,
        "source": {"sequence": json.dumps([str(commit) if commit else None, str(lsn)]), "lsn": lsn,
                   "txId": commit or 1, "ts_us": 1711848600123456}}}
    key = {"schema": KEYLESS_KEY, "payload": {"lsn": lsn, "seq": seq, "task_started_ms": 1}}
    return json.dumps(key).encode(), json.dumps(value).encode()


A, A2, B, C = (1, "a", "1.00"), (1, "a2", "1.00"), (2, "b " * 900, "2.00"), (3, "c", "3.00")
# A table without a key: a snapshot and a COPY with duplicates (rows of one LSN), an
# update and a delete of one of two equal rows, an update leaving a TOASTed value alone,
# a truncate, and at the end the primary key added (pgbench -i does that after loading).
KEYLESS_HISTORY = [
    _keyless("r", None, 10, 0, after=A), _keyless("r", None, 10, 1, after=A), _keyless("r", None, 10, 2, after=B),
    _keyless("c", 20, 21, 0, after=C), _keyless("c", 20, 21, 1, after=C), _keyless("c", 20, 21, 2, after=C),
    _keyless("u", 30, 31, 0, before=A, after=A2),
    _keyless("d", 40, 41, 0, before=C),
    _keyless("u", 50, 51, 0, before=B, after=(2, UNAVAILABLE, "2.50")),
    _keyless("c", 60, 61, 0, after=(4, "d", "4.00")),
    _keyless("d", 70, 71, 0, before=(4, "d", "4.00")),
    _keyless("c", 80, 81, 0, after=(4, "d", "4.00")),
]
KEYLESS_EXPECTED = {(1, "a", Decimal("1.00")): 1, (1, "a2", Decimal("1.00")): 1, (2, "b " * 900, Decimal("2.50")): 1,
                    (3, "c", Decimal("3.00")): 2, (4, "d", Decimal("4.00")): 1}
KEYLESS_TAIL = [
    event("t", None, 90, 91),
    _keyless("c", 100, 101, 0, after=(5, "e", "5.00")), _keyless("c", 100, 101, 1, after=(5, "e", "5.00")),
    _keyless("c", 100, 101, 2, after=(6, "f", "6.00")),
    _keyless("d", 110, 111, 0, before=(5, "e", "5.00")),
    event("u", 6, 120, 121, "f, keyed", "6.10", seen_at=None),  # after ALTER TABLE ADD PRIMARY KEY (id)
    event("c", 7, 120, 122, "g", "7.00", seen_at=None),
]
KEYLESS_TAIL_EXPECTED = {(5, "e", Decimal("5.00")): 1, (6, "f, keyed", Decimal("6.10")): 1,
                         (7, "g", Decimal("7.00")): 1}


def _multiset(spark, settings):
    from collections import Counter
    path = str(mirrors.mirror_path(settings, "widgets"))
    return Counter((r["id"], r["name"], r["price"]) for r in spark.read.format("delta").load(path).collect())


def test_a_table_without_a_key_is_mirrored_as_a_multiset_in_one_batch_or_split_at_random(spark, settings):
    """Equal rows are copies: each update or delete replaces or removes one of them, whatever
    the batch boundaries; then the table gains its key and is merged by it. A replayed
    batch changes nothing (random cuts, seeded; the seed is in the failure's message)."""
    import random
    history = KEYLESS_HISTORY + KEYLESS_TAIL
    seed = random.randrange(1 << 30)
    cuts = sorted(random.Random(seed).sample(range(1, len(history)), 5))
    for n, split in enumerate([[len(KEYLESS_HISTORY)], cuts]):
        lake = dataclasses.replace(settings, lake=settings.lake.with_name(f"lake{n}"))
        apply = new_batch(spark, lake)
        bounds = [0, *split, len(history)]
        for batch_id, (start, end) in enumerate(zip(bounds, bounds[1:])):
            apply(batch(spark, history[start:end], start), batch_id)
            if end == len(KEYLESS_HISTORY):
                assert _multiset(spark, lake) == KEYLESS_EXPECTED, f"cuts {split} (seed {seed})"
        apply(batch(spark, history[start:end], start), batch_id)  # the last batch replayed
        assert _multiset(spark, lake) == KEYLESS_TAIL_EXPECTED, f"cuts {split} (seed {seed})"


def _drop(table, commit, lsn, op="c"):
    """The row migration 0006's trigger writes for a DROP TABLE, as captured."""
    row = {"id": lsn, "schema_name": config.DEFAULT_SCHEMA, "table_name": table, "dropped_at": 1711848600123456}
    value = {"schema": {}, "payload": {"before": None, "after": row, "op": op, "source": {
        "sequence": json.dumps([str(commit), str(lsn)]), "lsn": lsn, "txId": commit, "ts_us": 1711848600123456}}}
    return json.dumps({"payload": {"id": lsn}}).encode(), json.dumps(value).encode()


def test_a_dropped_table_created_again_starts_from_no_rows(spark, settings):
    """DROP TABLE reaches the mirrors as a row of the drops topic: the mirror loses every row
    older than it, in the batch of the drop or of records after it, and the table created
    again under the name (other columns, other key values) is all the mirror holds. A
    snapshot read of a drop row (op r) is no drop."""
    renewed = [{"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "code"}]
    old = [event("c", k, 10, 10 + k, f"old {k}", "1.00") for k in (1, 2, 3)]
    new = [_change(renewed, "c", 1, 30, 31, code="new 1"), _change(renewed, "c", 4, 30, 32, code="new 4")]

    def rows(records, topics, first):
        return spark.createDataFrame([(k, v, t, 0, first + i, None) for i, ((k, v), t) in
                                      enumerate(zip(records, topics))], mirrors.RECORDS_DDL)
    history = [(r, TOPIC) for r in old] + [(_drop("widgets", 20, 21), mirrors.DROPS_TOPIC)] \
        + [(r, TOPIC) for r in new]
    for n, cuts in enumerate([[], [3], [4], [3, 4]]):
        lake = dataclasses.replace(settings, lake=settings.lake.with_name(f"lake{n}"))
        apply = new_batch(spark, lake)
        bounds = [0, *cuts, len(history)]
        for batch_id, (start, end) in enumerate(zip(bounds, bounds[1:])):
            part = history[start:end]
            apply(rows([r for r, _ in part], [t for _, t in part], start), batch_id)
        held = {k: r["code"] for k, r in mirror(spark, lake).items()}
        assert held == {1: "new 1", 4: "new 4"}, f"cuts {cuts}"
    snapshot_of_drop = rows([_drop("widgets", 40, 41, op="r")], [mirrors.DROPS_TOPIC], len(history))
    apply(snapshot_of_drop, len(bounds))
    assert set(mirror(spark, lake)) == {1, 4}


def test_a_merge_reads_only_the_files_its_keys_can_be_in(spark, settings):
    """The MERGE's condition carries the batch's keys as ranges (sync/delta/merge.py
    `extent`), so Delta skips every file whose keys lie outside them: here the file
    of keys 1000-1010 is removed from disk, and a batch changing keys 1 and 5005,
    deleting 5006 and redelivering a change of 5010 older than its delete (which reads
    the tombstones) applies without opening it."""
    from sync.delta.merge import last_commit_info

    apply, offset = new_batch(spark, settings), 0
    for n, keys in enumerate([range(1, 11), range(1000, 1011), range(5000, 5011)]):  # one file each
        events = [event("c", key, 10 + n, 10 + n, f"w{key}", "1.00") for key in keys]
        apply(batch(spark, events, offset), n)
        offset += len(events)
    apply(batch(spark, [event("d", 5010, 20, 20)], offset), 3)  # a tombstone: the next batch reads them
    path = mirrors.mirror_path(settings, "widgets")
    middle = {r[0] for r in spark.read.format("delta").load(str(path)).where("id BETWEEN 1000 AND 1010")
              .select("_metadata.file_path").collect()}
    assert len(middle) == 1
    Path(urlparse(middle.pop()).path).unlink()
    apply(batch(spark, [event("u", 1, 100, 101, "one", "2.00"), event("u", 5005, 100, 102, "five", "2.00"),
                        event("d", 5006, 100, 103), event("u", 5010, 15, 15, "older than its delete", "9.00")],
                offset + 1), 4)
    metrics = last_commit_info(str(path))["operationMetrics"]
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"]) == ("2", "1")


def test_a_key_of_another_ordered_type_gets_one_range_in_the_sessions_time_zone(spark, settings, monkeypatch):
    """A `timestamp` (without time zone) key: its range, least to greatest, goes to the
    condition through its text in Spark's time zone, not through this process' local one
    (here not UTC, which would shift it by hours), so the MERGE still finds every row the
    batch changes."""
    import time

    stamp = {"type": "int64", "optional": False, "name": "io.debezium.time.MicroTimestamp", "field": "at"}
    row = {"type": "struct", "fields": [stamp, {"type": "string", "optional": True, "field": "name"}],
           "optional": True}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                           {"type": "struct", "field": "source", "fields": []},
                                           {"type": "string", "field": "op"}]}

    def change(op, at, lsn, name=None):
        value = {"schema": schema, "payload": {
            "before": {"at": at} if op == "d" else None, "after": None if op == "d" else {"at": at, "name": name},
            "op": op, "source": {"sequence": json.dumps([str(lsn), str(lsn)]), "lsn": lsn, "txId": lsn,
                                 "ts_us": 1711848600123456}}}
        key = {"schema": {"type": "struct", "fields": [stamp], "optional": False}, "payload": {"at": at}}
        return json.dumps(key).encode(), json.dumps(value).encode()

    # 2024-03-31 01:30:00.000001, 2024-06-01 00:00:00, 2025-01-01 12:00:00.5
    times = [1711848600000001, 1717200000000000, 1735732800500000]
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        apply = new_batch(spark, settings)
        apply(batch(spark, [change("c", at, 10 + n, f"n{n}") for n, at in enumerate(times)]), 0)
        apply(batch(spark, [change("u", times[0], 20, "changed"), change("d", times[2], 21)], 3), 1)
    finally:
        monkeypatch.undo()
        time.tzset()
    path = str(mirrors.mirror_path(settings, "widgets"))
    rows = {r["at"]: r["name"] for r in spark.read.format("delta").load(path)
            .selectExpr("CAST(at AS string) AS at", "name").collect()}
    assert rows == {"2024-03-31 01:30:00.000001": "changed", "2024-06-01 00:00:00": "n1"}


def _column_change(old, new, commit, lsn):
    """The row migration 0009's trigger writes for a RENAME (new set) or DROP COLUMN of
    `widgets`, as captured."""
    row = {"id": lsn, "schema_name": config.DEFAULT_SCHEMA, "table_name": "widgets",
           "change": "drop" if new is None else "rename", "old_name": old, "new_name": new,
           "changed_at": 1711848600123456}
    value = {"schema": {}, "payload": {"before": None, "after": row, "op": "c", "source": {
        "sequence": json.dumps([str(commit), str(lsn)]), "lsn": lsn, "txId": commit, "ts_us": 1711848600123456}}}
    return json.dumps({"payload": {"id": lsn}}).encode(), json.dumps(value).encode()


NAME, PRICE = FIELDS[1], FIELDS[2]
LABEL = {**NAME, "field": "Label Text"}
# A table's history with its column changes (records of COLUMNS_TOPIC): rows 1 and 3 are
# never changed after `name` becomes "Label Text" and back, nor after `price` is dropped.
RENAMES = [
    (_change(FIELDS[:3], "c", 1, 10, 11, name="one", price="1.00"), TOPIC),
    (_change(FIELDS[:3], "c", 2, 10, 12, name="two", price="2.00"), TOPIC),
    (_change(FIELDS[:3], "c", 3, 10, 13, name="three", price="3.00"), TOPIC),
    (_column_change("name", "Label Text", 20, 21), mirrors.COLUMNS_TOPIC),
    (_change([FIELDS[0], LABEL, PRICE], "u", 2, 30, 31, **{"Label Text": "two, relabelled", "price": "2.50"}), TOPIC),
    (_column_change("price", None, 40, 41), mirrors.COLUMNS_TOPIC),
    (_change([FIELDS[0], LABEL], "c", 4, 50, 51, **{"Label Text": "four"}), TOPIC),
    (_column_change("Label Text", "name", 60, 61), mirrors.COLUMNS_TOPIC),
    (_change(FIELDS[:2], "c", 5, 70, 71, name="five"), TOPIC),
    # ADD COLUMN price DEFAULT 0 (no record): every row gets it, none the dropped price.
    (_change([*FIELDS[:2], {**PRICE, "default": "0.00"}], "c", 6, 80, 81, name="six", price="6.00"), TOPIC),
]


def _renamed(spark, settings, cuts, column_history):
    """The mirror (its columns, and each row's name) after RENAMES applied in batches split
    at `cuts`; `column_history` is what the column changes' topic holds when the first
    batch reads it."""
    apply = new_batch(spark, settings, column_history)
    bounds = [0, *cuts, len(RENAMES)]
    for batch_id, (start, end) in enumerate(zip(bounds, bounds[1:])):
        apply(spark.createDataFrame([(k, v, topic, 0, start + i, None) for i, ((k, v), topic)
                                     in enumerate(RENAMES[start:end])], mirrors.RECORDS_DDL), batch_id)
    table = spark.read.format("delta").load(str(mirrors.mirror_path(settings, "widgets")))
    return ([c for c in table.columns if not c.startswith("_")],
            {r["id"]: (r["name"], str(r["price"])) for r in table.collect()})


def test_renamed_and_dropped_columns_are_followed_in_one_batch_or_split_at_random(spark, settings):
    """RENAME and DROP COLUMN reach the mirrors as rows of the column changes' topic: the
    mirror renames or drops its column, the rows not changed since keep their values
    under the new name, a record written before a rename is read under the name it was
    written with, and a column added again after its drop holds its default, not the
    dropped values. The same whatever the batch boundaries (one batch, as a rebuild
    reads it, or random cuts, seeded), whether the history was read whole first (a
    rebuild: `column_history`) or arrives in the stream alone, and when a
    rename's record arrives after the records written under its new name (Kafka made the
    table's partition visible first): the new name was taken as a new column, then is
    filled from the old one."""
    import random

    from sync.cdc import columns as column_changes

    expected = (["id", "name", "price"], {1: ("one", "0.00"), 2: ("two, relabelled", "0.00"), 3: ("three", "0.00"),
                                          4: ("four", "0.00"), 5: ("five", "0.00"), 6: ("six", "6.00")})
    whole: column_changes.History = {}
    for (key, value), topic in RENAMES:
        if topic == mirrors.COLUMNS_TOPIC:
            column_changes.add(whole, *column_changes.parse(value))
    seed = random.randrange(1 << 30)
    random_cuts = sorted(random.Random(seed).sample(range(1, len(RENAMES)), 4))
    for n, (cuts, history) in enumerate([([], {}), ([], whole), (random_cuts, {})]):
        lake = dataclasses.replace(settings, lake=settings.lake.with_name(f"lake{n}"))
        assert _renamed(spark, lake, cuts, history) == expected, f"cuts {cuts}, history {bool(history)} (seed {seed})"
    late = dataclasses.replace(settings, lake=settings.lake.with_name("late"))
    apply = new_batch(spark, late)
    parts = [RENAMES[:3], [RENAMES[4]], [RENAMES[3]]]  # the rename's record after the update under its new name
    for batch_id, part in enumerate(parts):
        apply(spark.createDataFrame([(k, v, topic, 0, 10 * batch_id + i, None) for i, ((k, v), topic)
                                     in enumerate(part)], mirrors.RECORDS_DDL), batch_id)
    table = spark.read.format("delta").load(str(mirrors.mirror_path(late, "widgets")))
    assert {r["id"]: r["Label Text"] for r in table.collect()} == {1: "one", 2: "two, relabelled", 3: "three"}
    assert "name" not in table.columns


# -- whole source transactions (sync/cdc/transactions.py) ---------------------------------

def _in_transaction(change, xid, lsn):
    """A change record given Debezium's transaction block (provide.transaction.metadata)."""
    key, value = change
    parsed = json.loads(value)
    parsed["payload"]["transaction"] = {"id": f"{xid}:{lsn}", "total_order": 1, "data_collection_order": 1}
    return key, json.dumps(parsed).encode()


def _end(xid, widgets):
    """Transaction `xid`'s END: its commit LSN is below the next one's changes' previous commit
    (`event`'s `commit`, the xid here)."""
    return (json.dumps({"schema": {}, "payload": {"id": f"{xid}:{xid + 5}"}}).encode(),
            json.dumps({"schema": {}, "payload": {
                "status": "END", "id": f"{xid}:{xid + 5}", "event_count": widgets + 1, "ts_ms": 0,
                "data_collections": [{"data_collection": "public.widgets", "event_count": widgets},
                                     {"data_collection": "public.outbox", "event_count": 1}]}}).encode())


CHANGELOG_RECORDS = mirrors.RECORDS_DDL + ", timestamp timestamp"  # the Kafka source's columns the changelog keeps


class Kafka:
    """What Kafka keeps of a test's records: `records` gives a batch's rows (and keeps
    them), `read_again` reads offset ranges of them back (sync/cdc/transactions.py)."""

    def __init__(self, spark, columns=mirrors.RECORDS_DDL):
        self.spark, self.columns, self.kept = spark, columns, {}
        self.width = len(spark.createDataFrame([], columns).columns)

    def records(self, rows):
        for topic, offset, (key, value) in rows:
            self.kept[(topic, offset)] = (key, value, topic, 0, offset) + (None,) * (self.width - 5)
        return self.spark.createDataFrame([self.kept[(t, o)] for t, o, _ in rows], self.columns)

    def read_again(self, session, ranges):
        return session.createDataFrame(
            [r for (topic, offset), r in sorted(self.kept.items())
             if (topic, 0) in ranges and ranges[(topic, 0)][0] <= offset < ranges[(topic, 0)][1]], self.columns)


@pytest.mark.parametrize("settings", ["directory", "bucket"], indirect=True)
def test_a_batch_applies_whole_source_transactions_in_commit_order_and_holds_the_rest(spark, settings):
    """A transaction cut by a batch's end, its END before or after its changes: no version
    of the mirror shows part of one (the prefix in commit order: tests/unit/test_transactions.py).
    In a directory and in a bucket: the held transactions, the points, the fencing epochs
    and the progress are Lakesync's own files there (sync/lake.py)."""
    kafka = Kafka(spark)
    records, read_again = kafka.records, kafka.read_again
    txn = mirrors.transactions.TRANSACTIONS_TOPIC
    apply = mirrors.MirrorBatch(settings, fencing.take(spark, settings, mirrors.NAME, []), lambda: {}, read_again)
    path = str(mirrors.mirror_path(settings, "widgets"))
    # Transaction 40 whole; 50 cut by the batch's end, its END not yet read; 60 after it.
    apply(records([(TOPIC, 0, _in_transaction(event("c", 1, 40, 41, "a", "1.00"), 40, 41)),
                   (txn, 0, _end(40, 1)),
                   (TOPIC, 1, _in_transaction(event("c", 2, 50, 51, "b", "2.00"), 50, 51)),
                   (TOPIC, 2, _in_transaction(event("c", 3, 50, 52, "c", "3.00"), 50, 52))]), 0)
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "a"}
    point = points.latest(catalog.root(settings, mirrors.NAME), mirrors.NAME)  # sync/delta/points.py
    assert (point.batch, point.lsn, point.tables["mirror.widgets"]["version"]) == (0, 45, latest_version(path))
    # 50's END says three widgets: one is still to come; 60's END before its change.
    apply(records([(txn, 1, _end(50, 3)), (txn, 2, _end(60, 1))]), 1)
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "a"}
    # The last change of 50, then 60's: both apply, in one version.
    apply(records([(TOPIC, 3, _in_transaction(event("u", 1, 50, 53, "a2", "1.50"), 50, 53)),
                   (TOPIC, 4, _in_transaction(event("c", 4, 60, 61, "d", "4.00"), 60, 61))]), 2)
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "a2", 2: "b", 3: "c", 4: "d"}
    versions = DeltaTable.forPath(spark, path).history().select("version").collect()
    names = [sorted(r["name"] for r in spark.read.format("delta").option("versionAsOf", v["version"]).load(path)
                    .collect()) for v in versions]
    assert sorted(names, key=len) == [[], ["a"], ["a2", "b", "c", "d"]]  # (version 0: the table made)
    point = points.latest(catalog.root(settings, mirrors.NAME), mirrors.NAME)
    assert (point.batch, point.tables["mirror.widgets"]["version"]) == (2, latest_version(path))
    # Replayed, the last batch reads what the one before it held, and changes nothing.
    apply(records([(TOPIC, 3, _in_transaction(event("u", 1, 50, 53, "a2", "1.50"), 50, 53)),
                   (TOPIC, 4, _in_transaction(event("c", 4, 60, 61, "d", "4.00"), 60, 61))]), 2)
    assert len(DeltaTable.forPath(spark, path).history().collect()) == len(versions)
    # Turned off (LAKESYNC_WHOLE_TRANSACTIONS=off), the next batch applies what was held too.
    apply(records([(TOPIC, 5, _in_transaction(event("c", 5, 70, 71, "e", "5.00"), 70, 71))]), 3)
    assert 5 not in mirror(spark, settings)
    unsafe = mirrors.MirrorBatch(dataclasses.replace(settings, whole_transactions=False),
                                 fencing.take(spark, settings, mirrors.NAME, []), lambda: {}, read_again)
    unsafe(records([(TOPIC, 6, _in_transaction(event("c", 6, 80, 81, "f", "6.00"), 80, 81))]), 4)
    assert {5, 6} <= set(mirror(spark, settings))


def test_the_changelog_appends_whole_source_transactions_only(spark, settings):
    """The changelog holds what the mirrors hold: each version a prefix of whole source
    transactions in commit order."""
    kafka = Kafka(spark, CHANGELOG_RECORDS)
    records, read_again = kafka.records, kafka.read_again
    txn = mirrors.transactions.TRANSACTIONS_TOPIC
    apply = changelog.ChangelogBatch(settings, fencing.take(spark, settings, changelog.NAME, []), read_again)
    path = changelog.changelog_path(settings)

    def logged():
        return sorted((r["_offset"], r["_op"], r["_txid"]) for r in spark.read.format("delta").load(path).collect())

    # 40 whole; 50 cut by the first batch's end, its END in the second, its last change in
    # the third with 60's, whose END came before it.
    batches = [[(TOPIC, 0, _in_transaction(event("c", 1, 40, 41, "a", "1.00"), 40, 41)), (txn, 0, _end(40, 1)),
                (TOPIC, 1, _in_transaction(event("c", 2, 50, 51, "b", "2.00"), 50, 51))],
               [(txn, 1, _end(50, 2)), (txn, 2, _end(60, 1))],
               [(TOPIC, 2, _in_transaction(event("d", 2, 50, 52), 50, 52)),
                (TOPIC, 3, _in_transaction(event("c", 3, 60, 61, "c", "3.00"), 60, 61))]]
    expected = [[(0, "c", 40)], [(0, "c", 40)], [(0, "c", 40), (1, "c", 50), (2, "d", 50), (3, "c", 60)]]
    versions = []
    for batch_id, (rows, appended) in enumerate(zip(batches, expected)):
        apply(records(rows), batch_id)
        assert logged() == appended, f"batch {batch_id}"
        versions.append(latest_version(path))
    assert versions[1] == versions[0] < versions[2]  # nothing whole to append: no version
    apply(records(batches[-1]), 2)  # replayed: it reads what the batch before held, and appends nothing
    assert logged() == expected[-1]


def test_the_first_transaction_a_new_slot_streams_is_not_taken_for_one_applied_before(spark, settings):
    """After a resnapshot Debezium streams from a new slot, and the changes of the first
    transaction it streams carry no previous commit ([null, lsn]). Taken for changes
    applied before, they left the transaction short of its END's count: the changelog,
    and every projection following it, held it and all after it for good."""
    kafka = Kafka(spark, CHANGELOG_RECORDS)
    txn = mirrors.transactions.TRANSACTIONS_TOPIC
    apply = changelog.ChangelogBatch(settings, fencing.take(spark, settings, changelog.NAME, []), kafka.read_again)
    apply(kafka.records([(TOPIC, 0, _in_transaction(event("c", 1, 40, 41, "a", "1.00"), 40, 41)),
                         (txn, 0, _end(40, 1))]), 0)
    apply(kafka.records([(TOPIC, 1, _in_transaction(event("u", 1, None, 51, "b", "2.00"), 50, 51)),
                         (txn, 1, _end(50, 1))]), 1)
    logged = spark.read.format("delta").load(changelog.changelog_path(settings)).collect()
    assert sorted(r["_offset"] for r in logged) == [0, 1]
    assert mirrors.transactions.held_after(catalog.checkpoint(settings, changelog.NAME), 1).xids == set()


def test_the_mirrors_stop_where_the_changelog_they_follow_stands_and_a_replay_stops_there_again(
        spark, settings, monkeypatch):
    """Batches cut at common places (`Settings.aligned`, sync/delta/points.py `follow`):
    the changelog stopped after transaction 50, so the mirrors' batch that read 60 too
    stops there and holds 60; replayed once the changelog stands after 60, it still stops
    where it decided to (its commits before a crash hold just that). A batch that stops
    short asks for the batch after it (no record of an idle source would start one)."""
    monkeypatch.setattr(points, "FOLLOW_WAIT_SECONDS", 0.5)  # how long a batch waits for an idle leader
    asked = []  # (the heartbeat row touched: recorded, not written to a source this test has not)
    monkeypatch.setattr(batch_function, "touch_heartbeat", lambda _, row: asked.append(row))
    monkeypatch.setattr(batch_function, "ASK_EVERY_SECONDS", 0)  # every ask, however close
    settings = dataclasses.replace(settings, aligned=(changelog.NAME, mirrors.NAME))
    kafka = Kafka(spark, CHANGELOG_RECORDS)
    records, read_again = kafka.records, kafka.read_again
    txn = mirrors.transactions.TRANSACTIONS_TOPIC
    log = changelog.ChangelogBatch(settings, fencing.take(spark, settings, changelog.NAME, []), read_again)
    apply = mirrors.MirrorBatch(settings, fencing.take(spark, settings, mirrors.NAME, []), lambda: {},
                                lambda session, ranges: read_again(session, ranges).drop("timestamp"))
    t40, t50, t60 = ([(TOPIC, n, _in_transaction(event("c", n + 1, xid, xid + 1, name, "1.00"), xid, xid + 1)),
                      (txn, n, _end(xid, 1))] for n, (xid, name) in enumerate([(40, "a"), (50, "b"), (60, "c")]))
    log(records(t40 + t50), 0)
    apply(records(t40 + t50 + t60).drop("timestamp"), 0)
    assert sorted(mirror(spark, settings)) == [1, 2] and asked == [NEXT_BATCH_ROW]
    found = snapshot.published(settings)[-1]
    assert (found.offset, sorted(found.tables)) == (1, ["changelog", "mirror.widgets"])
    log(records(t60), 1)  # the changelog now stands after 60 too
    apply(records(t40 + t50 + t60).drop("timestamp"), 0)  # replayed
    assert sorted(mirror(spark, settings)) == [1, 2] and asked == [NEXT_BATCH_ROW] * 2
    heartbeat = [(txn, 3, _end(70, 0))]  # a transaction that changed no table read
    apply(records(heartbeat).drop("timestamp"), 1)
    assert sorted(mirror(spark, settings)) == [1, 2, 3]
    assert snapshot.published(settings)[-1].offset == 2  # not 3: the changelog has not read it
    assert asked == [NEXT_BATCH_ROW] * 3  # (so it holds 70, short of what it read)
