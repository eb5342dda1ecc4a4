"""Lakesync on a team's own database: the capture set it names (changed while everything
runs, a table added with its rows snapshotted alone), and nothing of Lakesync's or the
demo's in the application's schemas but the grants and the publication."""

import json
import time
from dataclasses import replace

import psycopg
import pytest

from projections import changelog, mirrors
from sync import config
from sync.commands import capture
from sync.commands.verify import verify
from sync.stack import connect, migrate, postgres
from sync.streaming.offsets import end_offsets
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


CAPTURE = "public,inventory,billing.invoice(s|_lines)"


def test_a_capture_set_of_several_schemas_and_table_patterns(db, stack, spark):
    """LAKESYNC_CAPTURE names whole schemas and schema.PATTERN entries, and `lakesync up`
    renders it into the publication, the grants and the connector while everything runs.
    A table named like a public one gets a mirror of its own; a table the pattern leaves
    out gets none; a keyless table that existed before its schema was captured takes
    UPDATE and DELETE (REPLICA IDENTITY FULL set by `up`). A schema that does not exist is
    refused in one line, and nothing changes."""
    refused = lakesync("up", env={"LAKESYNC_CAPTURE": "public,nowhere"})
    assert refused.returncode != 0 and "nowhere" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    db.execute("CREATE SCHEMA inventory")
    db.execute("CREATE SCHEMA billing")
    db.execute("CREATE TABLE inventory.bins (shelf text, qty int)")  # keyless, before it is captured
    env = {"LAKESYNC_CAPTURE": CAPTURE}
    lakesync("up", env=env, check=True)
    settings = replace(stack, capture=config.parse_capture(CAPTURE))
    published = {row[0] for row in db.execute(
        "SELECT n.nspname FROM pg_publication p JOIN pg_publication_namespace pn ON pn.pnpubid = p.oid "
        "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = %s", (config.PUBLICATION,))}
    assert published == {"public", "inventory", "billing", config.CONTROL_SCHEMA}
    include = connect.rest(settings, "GET", f"/connectors/{config.CONNECTOR_NAME}/config")["table.include.list"]
    assert include.startswith("public\\..*,inventory\\..*,billing\\.invoice(s|_lines),"), include

    db.execute("CREATE TABLE inventory.customers (id int PRIMARY KEY, label text, \"Unit Price\" numeric(10,3))")
    db.execute("CREATE TABLE billing.invoices (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL)")
    db.execute("CREATE TABLE billing.invoice_lines (invoice bigint, line int, sku text, PRIMARY KEY (invoice, line))")
    db.execute("CREATE TABLE billing.drafts (id int PRIMARY KEY)")  # left out by the pattern
    db.execute("INSERT INTO inventory.customers SELECT g, 'item ' || g, g / 8.0 FROM generate_series(1, 25) g")
    db.execute("INSERT INTO billing.invoices SELECT g, g * 1.25 FROM generate_series(1, 10) g")
    db.execute("INSERT INTO billing.invoice_lines SELECT g % 10 + 1, g, 'sku-' || g FROM generate_series(1, 30) g")
    db.execute("INSERT INTO billing.drafts SELECT generate_series(1, 5)")
    db.execute("INSERT INTO inventory.bins VALUES ('a', 1), ('a', 1), ('b', 2), ('c', 3)")
    db.execute("UPDATE inventory.bins SET qty = 5 WHERE shelf = 'b'")
    db.execute("DELETE FROM inventory.bins WHERE ctid = (SELECT min(ctid) FROM inventory.bins WHERE shelf = 'a')")
    db.execute("UPDATE inventory.customers SET label = 'renamed', \"Unit Price\" = 0.125 WHERE id <= 5")
    db.execute("DELETE FROM inventory.customers WHERE id > 20")
    db.execute("DELETE FROM billing.invoice_lines WHERE line > 25")
    # A table created in a captured schema after `up`: readable by the capture role (its
    # snapshots) through the default privileges, keyless, so the trigger sets its identity.
    db.execute("CREATE TABLE inventory.moves (bin text, delta int)")
    db.execute("INSERT INTO inventory.moves VALUES ('a', 1), ('a', 1)")
    db.execute("UPDATE inventory.moves SET delta = 2")
    assert db.execute("SELECT has_table_privilege(%s, 'inventory.moves', 'SELECT')",
                      (config.ROLES["capture"],)).fetchone()[0]

    names = {"mirror.customers", "mirror.inventory.customers", "mirror.inventory.bins", "mirror.inventory.moves",
             "mirror.billing.invoices", "mirror.billing.invoice_lines", "changelog"}
    lakesync("wait", *sorted(names), "--timeout", "600", env=env, timeout=660, check=True)
    reports = {r.name: r for r in verify(settings, spark=spark, only=names)}
    assert set(reports) == names
    bad = [r.as_json() for r in reports.values() if r.differences]
    assert not bad, json.dumps(bad, indent=2, default=str)
    assert [reports[f"mirror.{t}"].target_rows for t in ("inventory.customers", "inventory.bins", "inventory.moves",
                                                          "billing.invoices", "billing.invoice_lines")] \
        == [20, 3, 2, 10, 25]
    assert reports["mirror.customers"].target_rows != 20  # the public table's mirror is another one
    assert not mirrors.mirror_path(stack, "billing.drafts").exists()
    with postgres.pg_connect(settings) as conn:
        assert "mirror.billing.drafts" not in {t.name for t in mirrors.PROJECTION.verify_targets(settings, conn)}
        # The session's own settings capture public alone: these mirrors are not compared there.
        assert not {t.name for t in mirrors.PROJECTION.verify_targets(stack, conn)} & names - {"mirror.customers"}


# Everything a database holds outside Postgres' own schemas, by kind and name.
OBJECTS = """
    SELECT 'relation', n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL SELECT 'function', n.nspname || '.' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL SELECT 'trigger', tgrelid::regclass || '.' || tgname FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT 'schema', nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
    UNION ALL SELECT 'event trigger', evtname FROM pg_event_trigger
    UNION ALL SELECT 'publication', pubname FROM pg_publication"""


def test_a_second_database_gets_only_lakesyncs_own_objects(db, stack):
    """An application's database of its own (schema `shop`, tables owned by its own role,
    none of the demo's) taken through `up`'s database steps (the migrations, then the
    capture set: what `up --external` runs before it registers the connector): it gains
    Lakesync's control schema, the publication of `shop`, the event triggers and the
    capture role's grants, and nothing in `shop` or `public`; its keyless table takes
    UPDATE and DELETE once published."""
    db.execute("DROP DATABASE IF EXISTS shopdb")
    db.execute("CREATE DATABASE shopdb")
    db.execute("DO $$ BEGIN CREATE ROLE shop_owner; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    settings = replace(stack, pg_dsn=stack.pg_dsn.rsplit("/", 1)[0] + "/shopdb",
                       capture=config.parse_capture("shop"))
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as shop:
            shop.execute("CREATE SCHEMA shop AUTHORIZATION shop_owner")
            shop.execute("SET ROLE shop_owner")
            shop.execute("CREATE TABLE shop.carts (id bigint PRIMARY KEY, customer text, total numeric(10,2))")
            shop.execute("CREATE TABLE shop.cart_events (cart bigint, what text)")  # keyless
            shop.execute("RESET ROLE")
            before = set(shop.execute(OBJECTS).fetchall())

            migrate.upgrade(settings)
            migrate.upgrade(settings)  # `up` again: nothing more, nothing fails

            added = set(shop.execute(OBJECTS).fetchall()) - before
            outside = {(kind, name) for kind, name in added
                       if kind not in ("event trigger", "publication") and name.split(".")[0] != config.CONTROL_SCHEMA}
            assert outside == set(), f"objects outside Lakesync's schema: {sorted(outside)}"
            assert ("schema", config.CONTROL_SCHEMA) in added and ("publication", config.PUBLICATION) in added
            assert not any(name.split(".")[-1] in ("customers", "orders", "accounts", "outbox", "payments")
                           for _, name in shop.execute(OBJECTS).fetchall())
            published = shop.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables "
                                     "WHERE pubname = %s ORDER BY 1", (config.PUBLICATION,)).fetchall()
            assert [name for (name,) in published if not name.startswith(f"{config.CONTROL_SCHEMA}.")] \
                == ["shop.cart_events", "shop.carts"]
            capture = config.ROLES["capture"]
            assert shop.execute("SELECT has_table_privilege(%s, 'shop.carts', 'SELECT')", (capture,)).fetchone()[0]
            # The application's role goes on writing its tables, the keyless one included,
            # and a table it creates later is readable by the capture role (snapshots).
            shop.execute("SET ROLE shop_owner")
            shop.execute("INSERT INTO shop.cart_events VALUES (1, 'add'), (1, 'add')")
            shop.execute("UPDATE shop.cart_events SET what = 'remove' WHERE ctid = (SELECT min(ctid) FROM shop.cart_events)")
            shop.execute("DELETE FROM shop.cart_events WHERE what = 'add'")
            shop.execute("CREATE TABLE shop.coupons (code text)")
            shop.execute("DELETE FROM shop.coupons")
            shop.execute("RESET ROLE")
            assert shop.execute("SELECT has_table_privilege(%s, 'shop.coupons', 'SELECT')", (capture,)).fetchone()[0]
            assert shop.execute("SELECT relreplident FROM pg_class WHERE oid = 'shop.coupons'::regclass").fetchone()[0] \
                == "f"
    finally:
        db.execute("DROP DATABASE IF EXISTS shopdb WITH (FORCE)")
        db.execute("DROP ROLE IF EXISTS shop_owner")


def test_capture_add_snapshots_a_table_alone_while_everything_runs(db, stack, spark):
    """A table created with 10k rows in a schema nothing captured: `lakesync capture add`
    snapshots it alone (Debezium's incremental snapshot, beside the stream) and streams it
    from then on; no other table's topic gets a record; `status` shows the snapshot until
    it is done; `capture add` again changes nothing; `capture remove` takes it out."""
    db.execute("CREATE SCHEMA late")
    db.execute("CREATE TABLE late.big (id bigint PRIMARY KEY, label text, amount numeric(12,2))")
    db.execute("INSERT INTO late.big SELECT g, 'row ' || g, g / 100.0 FROM generate_series(1, 10000) g")
    before = end_offsets(stack, mirrors.TOPICS.pattern)
    added = lakesync("capture", "add", "late.big", check=True)
    assert "snapshot asked for   late.big" in added.stdout, added.stdout
    settings = config.load()  # the capture set as `capture add` left it (<home>/capture.json)
    assert "late.big" in settings.capture.texts() and settings.capture_added == ("late.big",)
    seen = []  # what `status` shows of the snapshot (the same function, without a process per look)
    deadline = time.monotonic() + 600
    while not seen or seen[-1]["state"] != "done":
        assert time.monotonic() < deadline, f"the snapshot of late.big did not finish: {seen}"
        seen.append(capture.snapshots(settings, connect.source_offset(settings))["late.big"])
        time.sleep(0.2)  # between two looks at a state that moves (no barrier tells a snapshot's steps)
    assert {s["state"] for s in seen[:-1]} & {"requested", "running"}, seen  # its progress, before it was done
    report = json.loads(lakesync("status", "--json").stdout)
    assert report["components"]["connect"]["snapshots"]["late.big"] == {"state": "done"}
    db.execute("UPDATE late.big SET label = 'changed' WHERE id <= 100")
    db.execute("DELETE FROM late.big WHERE id > 9990")
    db.execute("INSERT INTO late.big VALUES (20000, 'new', 1.50)")

    lakesync("wait", "mirror.late.big", "changelog", "--timeout", "600", timeout=660, check=True)
    reports = {r.name: r for r in verify(settings, spark=spark, only={"mirror.late.big"})}
    bad = [r.as_json() for r in reports.values() if r.differences]
    assert not bad, json.dumps(bad, indent=2, default=str)
    assert reports["mirror.late.big"].target_rows == 9991
    snapshot_rows = (spark.read.format("delta").load(changelog.changelog_path(settings))
                     .where("`table` = 'late.big' AND _op = 'r'").count())
    assert snapshot_rows == 10_000
    after = end_offsets(stack, mirrors.TOPICS.pattern)
    assert {t: o for t, o in after.items() if t[0] != "lakesync.late.big"} == before  # no second snapshot

    again = lakesync("capture", "add", "late.big", check=True)
    assert "already captured" in again.stdout and end_offsets(stack, mirrors.TOPICS.pattern) == after
    listed = json.loads(lakesync("capture", "list", "--json", check=True).stdout)
    assert {"entry": "late.big", "from": "capture add", "mirrors": ["mirror.late.big"]} in listed
    refused = lakesync("capture", "remove", "public")
    assert refused.returncode == 2 and "LAKESYNC_CAPTURE" in refused.stderr
    lakesync("capture", "remove", "late.big", check=True)
    settings = config.load()
    assert "late.big" not in settings.capture.texts()
    db.execute("DROP TABLE late.big")  # no longer captured: its mirror stays, and is compared no more
    with postgres.pg_connect(settings) as conn:
        assert "mirror.late.big" not in {t.name for t in mirrors.PROJECTION.verify_targets(settings, conn)}
    assert mirrors.mirror_path(settings, "late.big").exists()
