"""The changelog's check (projections/changelog.py `live_keys`, `repeated_positions`): a
changelog's replay by DuckDB, on a changelog delta-rs writes."""

import pyarrow as pa
from deltalake import write_deltalake

from projections.changelog import live_keys, repeated_positions
from sync.config import TABLE_DROPS_TABLE
from sync.delta import reader

# (table, op, key, before, after, commit LSN, LSN, offset): one partition per table's topic
CHANGES = [
    # the latest change by source position decides, not the latest offset
    ("public.a", "c", '{"id":1}', None, '{"id":1}', 10, 10, 1),
    ("public.a", "u", '{"id":1}', '{"id":1}', '{"id":1}', 20, 20, 2),
    ("public.a", "c", '{"id":2}', None, '{"id":2}', 10, 11, 3),
    ("public.a", "d", '{"id":2}', '{"id":2}', None, 30, 30, 4),
    ("public.a", "d", '{"id":3}', '{"id":3}', None, 5, 5, 6),
    ("public.a", "c", '{"id":3}', None, '{"id":3}', 10, 12, 5),
    ("public.a", "c", '{"id":9}', None, '{"id":9}', 1, 1, 0),  # before the resnapshot's start: not read
    # made while the table had no key: keyed by its row image, grouped with the later keyed change
    ("public.k", "c", None, None, '{"id":7,"name":"é","v":"x"}', 10, 10, 1),
    ("public.k", "u", '{"id": 7, "name": "é"}', None, '{"id":7,"name":"é","v":"y"}', 20, 20, 2),
    ("public.k", "c", None, None, '{"id":8,"name":"b"}', 10, 11, 3),
    ("public.k", "d", None, '{"id":8,"name":"b"}', None, 11, 11, 4),
    ("public.k", "d", None, None, None, 12, 12, 5),  # a delete without its row image: no key
    # a truncate ends the rows before it
    ("public.t", "c", '{"id":1}', None, '{"id":1}', 10, 10, 1),
    ("public.t", "t", None, None, None, 20, 20, 2),
    ("public.t", "c", '{"id":2}', None, '{"id":2}', 30, 30, 3),
    # and a drop of the table likewise
    ("public.dropped", "c", '{"id":1}', None, '{"id":1}', 40, 40, 1),
    (TABLE_DROPS_TABLE, "c", '{"id":1}', None, '{"schema_name":"public","table_name":"dropped"}', 50, 50, 1),
    # a key column renamed from id to ident: its changes before the rename under its name now
    ("public.r", "c", '{"id":5}', None, '{"id":5}', 10, 10, 1),
    ("public.r", "u", '{"ident":5}', None, '{"ident":5}', 20, 20, 2),
    # a table verify does not compare
    ("public.other", "c", '{"id":1}', None, '{"id":1}', 10, 10, 1),
]
KEY_COLUMNS = {"public.a": ["id"], "public.k": ["id", "name"], "public.t": ["id"], "public.dropped": ["id"],
               "public.r": ["ident"]}
RENAMED = {"public.r": {"id": "ident"}}
START = {("lakesync.public.a", 0): 1}


def changelog(path: str, changes: list[tuple]) -> str:
    names = ["table", "_op", "key", "before", "after", "_commit_lsn", "_lsn", "_offset"]
    columns = {name: [change[n] for change in changes] for n, name in enumerate(names)}
    write_deltalake(path, pa.table({
        **{name: pa.array(columns[name], pa.string()) for name in names[:5]},
        "_commit_lsn": pa.array(columns["_commit_lsn"], pa.int64()), "_lsn": pa.array(columns["_lsn"], pa.int64()),
        "_topic": pa.array([f"lakesync.{table}" for table in columns["table"]]),
        "_partition": pa.array([0] * len(changes), pa.int32()),
        "_offset": pa.array(columns["_offset"], pa.int64()),
    }))
    return path


def test_the_replay_leaves_the_keys_live_now_under_their_names_now(tmp_path):
    path = changelog(str(tmp_path / "changelog"), CHANGES)
    live = live_keys(reader.connect(), path, KEY_COLUMNS, RENAMED, START,
                     ["public.a", "public.k", "public.t", "public.dropped", "public.r"])
    # (keys as DuckDB writes JSON: compact, UTF-8, the key columns in their order)
    assert sorted(live) == [
        ("public.a", '{"id":1}'), ("public.a", '{"id":3}'),
        ("public.k", '{"id":7,"name":"é"}'),
        ("public.r", '{"ident":5}'),
        ("public.t", '{"id":2}'),
    ]


def test_a_changelog_of_keyless_tables_only_has_no_live_key(tmp_path):
    path = changelog(str(tmp_path / "changelog"), [("public.k", "c", None, None, '{"id":1}', 1, 1, 0)])
    assert list(live_keys(reader.connect(), path, {}, {}, {}, [])) == []


def test_a_position_written_twice_is_counted(tmp_path):
    path = changelog(str(tmp_path / "changelog"), CHANGES + CHANGES[2:4])
    duck = reader.connect()
    assert repeated_positions(duck, path, {}) == 2
    assert repeated_positions(duck, path, {("lakesync.public.a", 0): 4}) == 1
    assert repeated_positions(duck, changelog(str(tmp_path / "once"), CHANGES), {}) == 0
