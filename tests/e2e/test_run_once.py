"""`lakesync run --once` (availableNow): stop the live runner, catch up in one go, resume.

Runs after the other end-to-end files: it stops the session's runner and starts it
again at the end, so the checkpoint is also shown to resume where it stopped. Its catch-up
runs in small batches, and one source transaction is larger than a batch, so Kafka batches
end inside source transactions: no version of the accounts' mirror, the changelog or the
ledger may hold part of one (sync/cdc/transactions.py), and at every consistent point the
mirrors agree with each other and with the ledger (sync/delta/points.py).
"""

import json
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from sqlalchemy import text
from sqlalchemy.orm import Session

from projections import changelog, mirrors
from projections.ledger import audit
from projections.ledger import projection as ledger
from sync import config
from sync.cdc.transactions import held_after
from sync.commands import snapshot
from sync.delta import catalog, points
from sync.delta.merge import latest_version
from sync.demo import bank, bank_clients
from sync.outbox import topic
from sync.stack.background import start_background, stop_background
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e

CUSTOMERS = range(670000, 670006)  # keys no other test uses
SMALL_BATCHES = {"LAKESYNC_MAX_OFFSETS_PER_TRIGGER": "40"}  # records per batch, over all topics


def currency_totals(rows) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for currency, balance in rows:
        totals[currency] = totals.get(currency, Decimal(0)) + balance
    return totals


def versions_of_transactions(spark, path: str, first: int) -> dict[int, set[int]]:
    """Per source transaction (`_txid`) with changes the Delta table at `path` added in its
    versions from `first` on: the versions that added them (a file's version, from the log)."""
    log = Path(path) / "_delta_log"
    added = {}
    for version in range(first, latest_version(path) + 1):
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            if "add" in (action := json.loads(line)):
                added[Path(action["add"]["path"]).name] = version
    rows = spark.read.format("delta").load(path).select("_txid", F.col("_metadata.file_path").alias("file"))
    found: dict[int, set[int]] = {}
    for row in rows.collect():
        version = added.get(Path(row["file"]).name)
        if version is not None:
            found.setdefault(row["_txid"], set()).add(version)
    return found


def test_run_once_processes_what_is_there_and_exits(stack, app_db, db, synced, spark):
    lakesync("wait", check=True)  # what other tests wrote is applied: the catch-up below is this test's
    assert stop_background(stack, timeout=60), "the session's runner is not running"
    accounts = str(mirrors.mirror_path(stack, "accounts"))
    first = latest_version(accounts) + 1
    root = catalog.root(stack, mirrors.NAME)
    last_point = points.latest(root, mirrors.NAME)
    entries = ledger.ledger_path(stack)
    first_entries = latest_version(entries) + 1
    log = changelog.changelog_path(stack)
    first_logged = latest_version(log) + 1
    before = snapshot.published(stack, of=snapshot.PUBLISHERS)

    engine = bank.engine(config.role_dsn(stack, config.ROLES["app"]))
    with Session(engine) as session, session.begin():  # every operation double-entry, one transaction each
        bank.open_house_accounts(session)
        for n in CUSTOMERS:
            session.execute(text("INSERT INTO customers (id, name, email) VALUES (:id, :name, :email)"),
                            {"id": n, "name": f"Once {n}", "email": f"once{n}@x"})
            session.execute(text("INSERT INTO accounts (id, customer_id, currency) VALUES (:id, :id, :c)"),
                            {"id": n, "c": "EUR" if n % 2 else "USD"})
            session.execute(text("INSERT INTO orders (id, customer_id, status) VALUES (:id, :id, 'placed')"), {"id": n})
    with Session(engine) as session:
        for n in CUSTOMERS:
            with session.begin():
                bank.deposit(session, n, Decimal("500.0000"))
        # One transaction of more changes than a batch may take from one topic (60 account
        # updates, 60 postings > 40): some batch of every projection below ends inside it.
        with session.begin():
            for deposit in range(30):
                bank.deposit(session, CUSTOMERS[deposit % len(CUSTOMERS)], Decimal("1.0000"))
    engine.dispose()
    assert bank_clients(stack, seed=7, clients=2, operations=15)["committed"] > 0
    app_db.execute("INSERT INTO products (id, sku, name, price) SELECT g, 'ONCE-' || g, 'once', g "
                   "FROM generate_series(7000, 7099) g")
    app_db.execute("UPDATE products SET price = price + 0.01 WHERE id BETWEEN 7000 AND 7009")
    behind = lakesync("wait", "--timeout", "10")
    assert behind.returncode == 1 and "mirrors" in behind.stderr and "no runner is running" in behind.stderr

    again = lakesync("run", "--once", timeout=900, env=SMALL_BATCHES)
    assert again.returncode == 0, again.stderr[-2000:]
    lakesync("wait", "--timeout", "10", check=True)  # nothing left: --once caught up

    # Every version the catch-up made holds whole operations only: each currency's total
    # is Postgres' at every one, though batches of 40 records cut through operations.
    # (How many versions depends on how Spark shares each batch's 40 records among the
    # topics, and a batch holds every transaction after one not yet whole. Spark gives a
    # topic at most the batch's 40, so the 60-change transaction above is always cut; the
    # check below that a batch did end inside an operation shows it.)
    expected = currency_totals(db.execute("SELECT currency, balance FROM accounts").fetchall())
    versions = range(first, latest_version(accounts) + 1)
    for version in versions:
        rows = spark.read.format("delta").option("versionAsOf", version).load(accounts).select("currency", "balance")
        assert currency_totals(rows.collect()) == expected, f"version {version} holds part of a transaction"
    checkpoint = catalog.checkpoint(stack, mirrors.NAME)
    held = [held_after(checkpoint, int(p.stem)) for p in (checkpoint / "transactions").glob("*.json")]
    assert any(part[0] == "lakesync.public.accounts" for h in held for part in h.ranges), \
        "no batch ended inside an operation: the test did not cut one"

    # The changelog too: each source transaction's changes came in one version (some batch
    # cut one).
    split = {xid: found for xid, found in versions_of_transactions(spark, log, first_logged).items() if len(found) > 1}
    assert split == {}, f"changelog versions hold parts of transactions: {split}"
    checkpoint = catalog.checkpoint(stack, changelog.NAME)
    held = [held_after(checkpoint, int(p.stem)) for p in (checkpoint / "transactions").glob("*.json")]
    assert any(part[0] == "lakesync.public.accounts" for h in held for part in h.ranges), \
        "no changelog batch ended inside an operation: the test did not cut one"

    # At every consistent point the catch-up published, the mirrors read together: each
    # currency balances, and every account's customer is there (opened in one transaction).
    published = [p for p in points.published(root, mirrors.NAME) if last_point is None or p.batch > last_point.batch]
    published = [p for p in published if "mirror.accounts" in p.tables]  # (a fresh stack's first ones have none)
    assert published
    for point in published:
        tables = snapshot.dataframes(spark, stack, point)
        rows = tables["mirror.accounts"].select("currency", "balance").collect()
        assert currency_totals(rows) == expected, f"point of batch {point.batch}"
        customers = tables["mirror.customers"].select(F.col("id").alias("customer_id"))
        orphans = tables["mirror.accounts"].where("customer_id IS NOT NULL").join(customers, "customer_id", "left_anti")
        assert orphans.count() == 0, f"point of batch {point.batch}: an account ahead of its customer"

    # The ledger too: every version it made holds whole operations (some batch cut one), and
    # at every consistent point across the mirrors and the ledger each account's mirrored
    # balance is its ledger balance.
    for version in range(first_entries, latest_version(entries) + 1):
        assert audit.unbalanced_operations(audit.load(entries, version)) == [], f"ledger version {version}"
    checkpoint = catalog.checkpoint(stack, ledger.NAME)
    held = [held_after(checkpoint, int(p.stem)) for p in (checkpoint / "transactions").glob("*.json")]
    assert any(part[0] == topic(ledger.AGGREGATE) for h in held for part in h.ranges), \
        "no ledger batch ended inside an operation: the test did not cut one"
    # (The mirrors', the ledger's and the changelog's points alone: the views and event
    # time run once these have finished, so they stand only at the run's end, below.)
    consistent = [p for p in snapshot.published(stack, of=snapshot.PUBLISHERS)
                  if (not before or p.offset > before[-1].offset)
                  and "mirror.accounts" in p.tables]  # (a fresh stack's first ones have none)
    assert consistent
    for point in consistent:
        tables = snapshot.dataframes(spark, stack, point)
        postings = [r.asDict() for r in tables["ledger"].collect()]
        assert audit.unbalanced_operations(postings) == [], f"point at {point.offset}: an operation half-recorded"
        mirrored = tables["mirror.accounts"].select(F.col("id").alias("account"), F.col("balance").alias("mirrored"))
        differ = tables["ledger.balances"].join(mirrored, "account").where("balance <> mirrored")
        assert differ.count() == 0, f"point at {point.offset}: {differ.limit(3).collect()}"
    shown = json.loads(lakesync("snapshot", "--json", check=True).stdout)
    assert shown["offset"] == consistent[-1].offset and shown["tables"]["mirror.accounts"]["version"] == versions[-1]
    assert shown["tables"]["ledger"]["version"] == latest_version(entries)
    assert shown["tables"]["ledger"]["reader_path"] == shown["tables"]["ledger"]["path"]  # (a directory's)

    # The views and event time stand there too (each names the versions of the changelog,
    # the ledger and the mirrors it read): at the point, every ledger entry is enriched and
    # is an event-time input, and the current customers and the orders' documents are the
    # mirrors' customers and orders.
    point = snapshot.latest(stack)
    assert point.offset == shown["offset"]
    tables = snapshot.dataframes(spark, stack, point)
    assert set(tables) >= {"history.customers", "ledger.enriched", "view.customer_order_summary", "view.order_docs",
                           "event_time.inputs", "window.account_hourly", "join.order_payments"}, sorted(tables)

    def ids(frame, column):
        return {r[0] for r in frame.select(column).collect()}
    recorded = ids(tables["ledger"], "event_id")
    assert ids(tables["ledger.enriched"], "event_id") == recorded
    assert ids(tables["event_time.inputs"].where("stream = 'ledger'"), "event_id") == recorded
    assert ids(tables["history.customers"].where("is_current"), "id") == ids(tables["mirror.customers"], "id")
    assert ids(tables["view.order_docs"].where("NOT deleted"), "order_id") == ids(tables["mirror.orders"], "id")

    start_background(stack)
    app_db.execute("UPDATE products SET name = 'resumed' WHERE id = 7050")
    synced("products")
