"""Awkward Postgres data through the whole stack: every value must arrive exactly.

Each test creates its own table, writes to Postgres, passes the barrier and compares
with Postgres (verify canonicalises values by their Postgres type; see sync/commands/verify.py).
"""

import json
import random
import string

import pytest

from projections import changelog, mirrors
from sync.delta import deadletters
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


def test_awkward_values_arrive_exactly(db, synced, spark, stack):
    # Timestamps before the Gregorian reform (1582) are left out on purpose: Debezium's
    # snapshot reads them through JDBC's Julian calendar (year 99 comes out two days off)
    # while streaming gets them right, so a resnapshot would differ from the stream.
    db.execute("CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'happy')")
    db.execute("""CREATE TABLE public.awkward (
        id bigint PRIMARY KEY,
        wide numeric(38,18), free numeric, price numeric(12,2),
        at timestamptz, local_at timestamp, day date, clock time,
        label text, raw bytea, doc jsonb, tags text[], counts int[], mood public.mood,
        flag boolean, ratio real, measure double precision, ident uuid)""")
    db.execute("""INSERT INTO public.awkward VALUES
        (1, 12345678901234567890.123456789012345678, 3.14159265358979323846264338327950288419716939937510,
         -0.01, '1969-07-20 20:17:40.000001+00', '1900-01-01 00:00:00.5', '1900-02-28', '23:59:59.999999',
         'Grüße, 世界, emoji 🦆, combining é, quote '' and backslash \\', '\\x00ff10', '{"a": [1, 2, {"b": null}], "ü": "ß"}',
         '{"a", "b c", NULL}', '{1, NULL, 3}', 'happy', true, 'NaN', 'Infinity', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
        (2, -0.000000000000000001, 'NaN', 99999999.99, '2024-03-31 02:30:00+02', '2024-10-27 02:30:00', '2024-02-29',
         '00:00:00', '', '\\x', '[]', '{}', '{}', 'sad', false, '-Infinity', -1.5e-300, NULL),
        (3, NULL, 'Infinity', NULL, '2024-10-27 02:30:00 Europe/Berlin', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL),
        (4, NULL, '-Infinity', NULL, '1600-12-31 23:59:59.999999+00', NULL, NULL, NULL, NULL, NULL, 'null', NULL,
         NULL, NULL, NULL, NULL, NULL, NULL),
        (5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""")
    db.execute("UPDATE public.awkward SET id = 10 WHERE id = 1")  # a primary-key change
    db.execute("UPDATE public.awkward SET wide = wide * 2, mood = 'ok' WHERE id = 10")
    synced("awkward")
    rows = {r["id"]: r for r in spark.read.format("delta").load(str(mirrors.mirror_path(stack, "awkward"))).collect()}
    assert set(rows) == {2, 3, 4, 5, 10}
    assert str(rows[10]["wide"]) == "24691357802469135780.246913578024691356"
    assert (rows[2]["free"], rows[3]["free"], rows[4]["free"]) == ("NaN", "Infinity", "-Infinity")
    assert rows[10]["raw"] == b"\x00\xff\x10" and rows[10]["tags"] == ["a", "b c", None]
    assert rows[2]["at"].isoformat() == "2024-03-31T00:30:00"  # 02:30+02 is 00:30 UTC


def test_unchanged_toasted_text_is_kept_not_replaced_by_a_placeholder(db, app_db, synced, spark, stack):
    # Random text does not compress, so Postgres stores it out of line (TOAST), and an
    # update that leaves it alone does not log it: Debezium sends a placeholder.
    bio = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=20000))
    app_db.execute("INSERT INTO customers (id, name, email, tier, bio) VALUES (960001, 'toast', 't@toast', 'a', %s)",
                   (bio,))
    app_db.execute("UPDATE customers SET tier = 'b', updated_at = now() WHERE id = 960001")
    app_db.execute("UPDATE customers SET name = 'toast 2' WHERE id = 960001")
    synced("customers", "changelog")
    row = (spark.read.format("delta").load(str(mirrors.mirror_path(stack, "customers")))
           .where("id = 960001").first())
    assert row["bio"] == bio and row["tier"] == "b" and row["name"] == "toast 2"
    # The placeholder did reach Kafka (this test would prove nothing otherwise).
    log = spark.read.format("delta").load(changelog.changelog_path(stack))
    assert log.where("key LIKE '%960001%' AND after LIKE '%__debezium_unavailable_value%'").count() >= 1


def test_one_transaction_of_fifty_thousand_rows(db, synced):
    db.execute("CREATE TABLE public.bulk (id int PRIMARY KEY, n bigint, note text)")
    with db.transaction():
        db.execute("INSERT INTO public.bulk SELECT g, g * 2, 'row ' || g FROM generate_series(1, 50000) g")
        db.execute("UPDATE public.bulk SET n = n + 1 WHERE id % 7 = 0")
        db.execute("DELETE FROM public.bulk WHERE id % 10 = 0")
    reports = synced("bulk", timeout=600)
    assert reports["mirror.bulk"].source_rows == 45000 == reports["mirror.bulk"].target_rows
    # A TRUNCATE of a big table empties its mirror too (and keeps later snapshots small).
    db.execute("TRUNCATE public.bulk")
    assert synced("bulk")["mirror.bulk"].target_rows == 0


def test_a_value_its_column_cannot_hold_goes_to_the_dead_letters(db, synced, spark, stack):
    """numeric(p,s) allows NaN; Delta's decimal does not. The change is set aside, whole,
    counted in status, and the rest of the table goes on."""
    db.execute("CREATE TABLE public.priced (id int PRIMARY KEY, price numeric(10,2))")
    db.execute("INSERT INTO public.priced VALUES (1, 1.50), (2, 'NaN'), (3, 3.00)")
    lakesync("wait", "--timeout", "120", check=True)
    letters = (spark.read.format("delta").load(deadletters.path(stack, "mirrors"))
               .where("`table` = 'priced'").collect())
    assert len(letters) == 1 and "price" in letters[0]["error"]
    assert json.loads(letters[0]["value"])["payload"]["after"]["price"] == "NAN"  # as Debezium sent it
    status = json.loads(lakesync("status", "--json").stdout)
    entry = next(p for p in status["projections"] if p["name"] == "mirror.priced")
    assert entry["dead_letters"] == 1
    db.execute("UPDATE public.priced SET price = 2.00 WHERE id = 2")  # fixed at the source
    synced("priced")
