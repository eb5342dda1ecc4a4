"""Schema changes on captured tables, while everything runs (no restart).

ADD COLUMN with and without a default, type widening, RENAME and DROP COLUMN, tables that
stop only their own mirror, column names of every kind, tables without a primary key
(pgbench's among them).
"""

import json
import shutil
import subprocess

import pytest

from projections import mirrors
from sync.stack import postgres
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


def test_added_renamed_and_dropped_columns_and_widened_types_flow_through(db, synced, spark, stack):
    """Schema changes while everything runs. Added columns: the rows not changed since get
    the defaults Postgres gave them. RENAME and DROP COLUMN (migration 0009 records them
    at their place): the rows not changed since keep their values under the new name; in
    the renaming transaction, a change before the rename is read under the old name and
    one after it under the new; a renamed key column keys the mirror (and the changelog's
    check counts each row's changes from before and after it under one key); a rename
    with no change after it reaches the mirror too. Widened types are widened."""
    db.execute("CREATE TABLE public.evolving (id int PRIMARY KEY, qty int, label varchar(10), price numeric(8,2), "
               "gone text)")
    db.execute("INSERT INTO public.evolving VALUES (1, 1, 'one', 1.10, 'x'), (2, 2, 'two', 2.20, 'x'), "
               "(3, 3, 'three', 3.30, 'x'), (6, 6, 'six', 6.60, 'x')")
    synced("evolving")
    db.execute("ALTER TABLE public.evolving ADD COLUMN note text")
    db.execute("ALTER TABLE public.evolving ADD COLUMN stock int NOT NULL DEFAULT 7")
    db.execute("ALTER TABLE public.evolving ADD COLUMN since timestamptz DEFAULT '2020-02-29 12:00:00+00'")
    db.execute("INSERT INTO public.evolving (id, qty, label, price, note, stock) VALUES (4, 4, 'four', 4.40, 'n', 1)")
    with db.transaction():
        db.execute("UPDATE public.evolving SET label = 'uno' WHERE id = 1")
        db.execute('ALTER TABLE public.evolving RENAME COLUMN label TO "Label Text"')
        db.execute('UPDATE public.evolving SET "Label Text" = \'dos\' WHERE id = 2')
    db.execute("ALTER TABLE public.evolving DROP COLUMN gone")
    synced("evolving")  # rows 3 and 6 never changed: they get the defaults, and keep their labels
    db.execute('ALTER TABLE public.evolving ALTER COLUMN qty TYPE bigint, ALTER COLUMN "Label Text" TYPE text, '
               "ALTER COLUMN price TYPE numeric(12,4)")
    db.execute('INSERT INTO public.evolving (id, qty, "Label Text", price) VALUES (5, 1099511627776, '
               "'a label longer than ten', 12345678.1234)")
    synced("evolving")
    # (Once Debezium has read the changes after the last DDL: it takes the key from the
    # catalog when it meets such a change, docs/mirrors.md.)
    db.execute("ALTER TABLE public.evolving RENAME COLUMN id TO evolving_id")
    db.execute("UPDATE public.evolving SET qty = qty + 1 WHERE evolving_id = 3")
    db.execute("DELETE FROM public.evolving WHERE evolving_id = 4")
    db.execute("ALTER TABLE public.evolving RENAME COLUMN price TO amount")  # nothing written after it
    reports = synced("evolving", "changelog")
    assert reports["mirror.evolving"].source_rows == 5
    schema = {f.name: f.dataType.simpleString() for f in
              spark.read.format("delta").load(str(mirrors.mirror_path(stack, "evolving"))).schema.fields}
    assert [name for name in schema if not name.startswith("_")] == [
        "evolving_id", "qty", "Label Text", "amount", "note", "stock", "since"]
    assert (schema["qty"], schema["amount"], schema["stock"]) == ("bigint", "decimal(12,4)", "int")


def test_an_incompatible_change_stops_only_its_own_mirror(db, app_db, synced, stack):
    db.execute("CREATE TABLE public.breaking (id int PRIMARY KEY, code text)")
    db.execute("INSERT INTO public.breaking VALUES (1, 'a'), (2, 'bb')")
    synced("breaking")
    db.execute("ALTER TABLE public.breaking ALTER COLUMN code TYPE int USING length(code)")
    db.execute("INSERT INTO public.breaking VALUES (3, 3)")
    app_db.execute("UPDATE customers SET tier = 'after-break' WHERE id = (SELECT min(id) FROM customers)")
    lakesync("wait", "--timeout", "120", check=True)  # nothing is stuck: the records were set aside
    status = lakesync("status", "--json")
    assert status.returncode == 1
    entries = {p["name"]: p for p in json.loads(status.stdout)["projections"]}
    entry = entries["mirror.breaking"]
    assert "mirror stopped: column code changed type from string to int" in entry["stopped"]
    assert entry["dead_letters"] >= 1, entry
    assert "STOPPED" in lakesync("status").stdout
    synced("customers")  # the other mirrors go on
    # Clean up for the tests after this one: the table and its stopped mirror go.
    db.execute("DROP TABLE public.breaking")
    shutil.rmtree(mirrors.mirror_path(stack, "breaking"), ignore_errors=True)
    shutil.rmtree(mirrors.tombstone_path(stack, "breaking"), ignore_errors=True)


def test_any_column_name_postgres_allows_is_mirrored(db, synced, spark, stack):
    """Names Delta refuses without column mapping, and names Lakesync's own columns take
    (`_op`, `key`): those are mirrored with one more underscore (docs/mirrors.md)."""
    db.execute('CREATE TABLE public.named ("Key Id" int PRIMARY KEY, "Note Text" text, "MixedCase" int, '
               '"a.b" text, "ünï" text, "it\'s" text, "back`tick" text, "x,y(z)={};" numeric(6,2), _op text, key text)')
    toasted = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2000) g)"  # 64 KB, stored out of line
    db.execute(f"INSERT INTO public.named VALUES (1, {toasted}, 1, 'ab', 'ü', 'q', 'b', 1.50, 'mine', 'k'), "
               f"(2, 'short', 2, NULL, 'ï', 'r', 'c', 2.25, NULL, NULL)")
    db.execute('UPDATE public.named SET "MixedCase" = 10 WHERE "Key Id" = 1')  # "Note Text" unchanged: not sent
    db.execute('ALTER TABLE public.named ADD COLUMN "new col" int')  # (a default: the Spark test, in two batches)
    db.execute('INSERT INTO public.named ("Key Id", "Note Text", "new col") VALUES (3, \'three\', 8)')
    db.execute('DELETE FROM public.named WHERE "Key Id" = 2')
    db.execute('UPDATE public.named SET "Key Id" = 10 WHERE "Key Id" = 1')  # a key change; "Note Text" not sent
    db.execute('ALTER TABLE public.named RENAME COLUMN "a.b" TO _lsn')
    db.execute("UPDATE public.named SET _lsn = 'renamed' WHERE \"Key Id\" = 3")
    assert synced("named")["mirror.named"].source_rows == 2
    mirror = spark.read.format("delta").load(str(mirrors.mirror_path(stack, "named")))
    assert {"__op", "key", "__lsn", "_op", "_lsn"} <= set(mirror.columns) and "a.b" not in mirror.columns


def test_a_table_without_a_primary_key_is_captured_as_a_multiset(db, app_db, synced):
    """No DDL refused: a table created without a key, or whose key is dropped, gets REPLICA
    IDENTITY FULL, the application's UPDATE and DELETE on it succeed, and its mirror holds
    the rows Postgres holds, equal rows as many times (verify compares multisets)."""
    db.execute("CREATE TABLE public.keyless (a int, b text)")
    db.execute("CREATE TABLE public.unkeyed (a int PRIMARY KEY, b text)")
    db.execute("INSERT INTO public.unkeyed VALUES (1, 'x'), (2, 'y')")
    db.execute("ALTER TABLE public.unkeyed DROP CONSTRAINT unkeyed_pkey")
    identities = dict(db.execute("SELECT relname, relreplident FROM pg_class "
                                 "WHERE relname IN ('keyless', 'unkeyed')").fetchall())
    assert identities == {"keyless": "f", "unkeyed": "f"}
    toasted = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2000) g)"  # 64 KB, out of line
    app_db.execute(f"INSERT INTO public.keyless VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, {toasted}), (3, NULL)")
    one_of = "ctid IN (SELECT ctid FROM public.keyless WHERE a = 1 LIMIT 1)"
    app_db.execute(f"UPDATE public.keyless SET b = 'one of three' WHERE {one_of}")
    app_db.execute(f"DELETE FROM public.keyless WHERE {one_of} AND b = 'x'")
    app_db.execute("UPDATE public.keyless SET a = 20 WHERE a = 2")  # its TOASTed b left alone
    app_db.execute("DELETE FROM public.keyless WHERE a = 3")
    app_db.execute("INSERT INTO public.unkeyed VALUES (1, 'x')")  # a duplicate, now that there is no key
    app_db.execute("UPDATE public.unkeyed SET b = 'z' WHERE b = 'y'")
    reports = synced("keyless", "unkeyed")
    assert (reports["mirror.keyless"].source_rows, reports["mirror.unkeyed"].source_rows) == (3, 3)


def test_pgbench_in_the_captured_schema(db, stack, synced):
    """Postgres' own benchmark, unmodified, as many teams first try a CDC tool: `pgbench -i`
    creates its tables without keys, loads them with COPY and adds the keys afterwards;
    `pgbench_history` stays keyless. All four mirrored, and equal to Postgres."""
    pgbench = str(postgres.binaries() / "pgbench")
    subprocess.run([pgbench, "-i", "-s", "1", stack.pg_dsn], check=True, capture_output=True, timeout=300)
    subprocess.run([pgbench, "-c", "4", "-T", "30", stack.pg_dsn], check=True, capture_output=True, timeout=300)
    some = "ctid IN (SELECT ctid FROM pgbench_history ORDER BY ctid LIMIT {})"
    db.execute("INSERT INTO pgbench_history SELECT * FROM pgbench_history ORDER BY ctid LIMIT 2")  # equal rows
    db.execute(f"UPDATE pgbench_history SET delta = delta + 1 WHERE {some.format(3)}")
    db.execute(f"DELETE FROM pgbench_history WHERE {some.format(1)}")
    tables = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
    reports = synced(*tables, "changelog")
    assert reports["mirror.pgbench_accounts"].source_rows == 100_000
    assert reports["mirror.pgbench_history"].source_rows > 1
    # The next tests' checks of every target need not compare 100k more rows.
    for table in tables:
        db.execute(f"DROP TABLE {table}")
        shutil.rmtree(mirrors.mirror_path(stack, table), ignore_errors=True)
        shutil.rmtree(mirrors.tombstone_path(stack, table), ignore_errors=True)


def test_a_table_dropped_and_created_again_starts_from_no_rows(db, synced):
    """DROP TABLE then CREATE TABLE under the same name, other columns, some of the same
    key values: the mirror holds the new table's rows only (migration 0006 records the
    drop), and a table dropped for good leaves an empty mirror."""
    db.execute("CREATE TABLE public.recreated (id int PRIMARY KEY, old_col text)")
    db.execute("CREATE TABLE public.dropped (id int PRIMARY KEY)")
    db.execute("INSERT INTO public.recreated SELECT g, 'old' FROM generate_series(1, 60) g")
    db.execute("INSERT INTO public.dropped SELECT generate_series(1, 5)")
    synced("recreated", "dropped")
    db.execute("DROP TABLE public.recreated, public.dropped")
    db.execute("CREATE TABLE public.recreated (id int PRIMARY KEY, new_col int)")
    db.execute("INSERT INTO public.recreated SELECT g, g FROM generate_series(1, 20) g")
    reports = synced("recreated", "dropped", "changelog")
    assert (reports["mirror.recreated"].target_rows, reports["mirror.dropped"].target_rows) == (20, 0)

