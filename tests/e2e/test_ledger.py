"""The outbox, the ledger and the auditor's commands on the whole stack.

Concurrent bank clients write balances and outbox events in one transaction each;
Debezium's router publishes the events; the ledger projection appends and chains them.
Postgres is the oracle: after the barrier, verify compares every account's entry count
and balance with Postgres, recomputes the chains and checks every operation sums to zero.
"""

import dataclasses
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy.orm import Session

from projections.ledger import audit
from projections.ledger import projection as ledger
from sync import config
from sync.delta import fencing
from sync.demo import bank, bank_clients
from sync.outbox import topic
from tests.e2e.conftest import connector_compression, lakesync, open_bank_accounts

pytestmark = pytest.mark.e2e

CUSTOMERS = range(660000, 660012)  # keys no other test uses


@pytest.fixture(scope="module")
def bank_open(stack):
    """Twelve customers with an account each (EUR and USD) and an opening deposit."""
    engine = bank.engine(config.role_dsn(stack, config.ROLES["app"]))
    open_bank_accounts(engine, CUSTOMERS, "Bank")
    yield engine
    engine.dispose()


def ledger_files(settings) -> dict[str, tuple[int, int]]:
    """Every file of the ledger's tables, with its size and modification time."""
    folders = [Path(ledger.ledger_path(settings)), Path(ledger.balances_path(settings))]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for f in folders for p in f.rglob("*") if p.is_file()}


def test_concurrent_transfers_keep_the_books_balanced(stack, bank_open, db, synced):
    counts = bank_clients(stack, seed=4, clients=4, operations=60, accounts=CUSTOMERS)
    assert counts["committed"] > 180, counts  # refused: a transfer to itself, or not enough funds
    # Double entry: every posting has its opposite, so all balances together stay at zero.
    assert db.execute("SELECT sum(balance) FROM accounts").fetchone()[0] == 0
    # Per account: entries and balance equal Postgres; chains and operations check.
    reports = synced("accounts", "outbox_sequence", "ledger", "ledger.balances")
    assert reports["ledger"].source_rows >= 14 and reports["ledger.balances"].source_rows >= 14
    entries = audit.load(ledger.ledger_path(stack))
    (emitted,) = db.execute("SELECT sum(last_seq) FROM outbox_sequence WHERE aggregate_type = 'account'").fetchone()
    assert len(entries) == emitted >= 2 * counts["committed"]
    assert sum(e["amount"] for e in entries) == 0
    # Corrections are new entries that name what they correct, never edits.
    operations = {e["operation_id"] for e in entries}
    reversals = [e for e in entries if e["operation"] == "reversal"]
    assert reversals and all(e["corrects"] in operations for e in reversals)
    assert all(e["_txid"] and e["_commit_lsn"] and e["recorded_at"] >= e["event_time"] for e in entries)


def test_the_auditor_commands_only_read(stack, bank_open, synced):
    bank_clients(stack, seed=5, clients=2, operations=20)
    synced("accounts", "ledger")
    before = ledger_files(stack)  # the runner is idle now: nothing else writes there
    # The auditor's environment: the read-only role, and nothing but the lake to read.
    auditor = {"LAKESYNC_PG_DSN": config.role_dsn(stack, config.ROLES["auditor"])}

    checked = lakesync("ledger", "verify", env=auditor)
    assert checked.returncode == 0 and "ledger verify: OK" in checked.stdout, checked.stderr
    digest = lakesync("ledger", "digest", env=auditor, check=True).stdout.strip()
    version = int(digest.split(":")[0])
    account = CUSTOMERS[0]
    history = lakesync("ledger", "history", str(account), "--version", str(version), env=auditor, check=True)
    assert "1000.0000" in history.stdout.splitlines()[1]  # the opening deposit comes first
    counted = lakesync("ledger", "query", f"SELECT count(*) AS n FROM ledger WHERE account = {account}",
                       env=auditor, check=True)
    assert int(counted.stdout.splitlines()[1]) == len(history.stdout.splitlines()) - 1
    total = lakesync("ledger", "query", "SELECT sum(balance) AS total FROM ledger_balances", env=auditor, check=True)
    assert Decimal(total.stdout.splitlines()[1]) == 0  # double entry, read by the auditor's reader
    refused = lakesync("ledger", "query", "DELETE FROM ledger", env=auditor)
    assert refused.returncode == 2 and "only SELECT or WITH" in refused.stderr
    assert ledger_files(stack) == before  # the auditor's commands wrote nothing

    # More business, then the digest still holds: appends never disturb what it covers.
    bank_clients(stack, seed=6, clients=2, operations=10)
    synced("accounts", "ledger")
    again = lakesync("ledger", "verify", "--digest", digest, env=auditor)
    assert again.returncode == 0 and "unchanged since digest" in again.stdout, again.stdout + again.stderr
    earlier = lakesync("ledger", "history", str(account), "--version", str(version), env=auditor, check=True)
    assert earlier.stdout == history.stdout  # time travel: the past does not move


def test_a_redelivered_event_makes_no_second_entry(stack, bank_open, synced):
    """Copy an event already in the topic to its end, as a Connect crash would."""
    synced("accounts", "ledger")
    entries_before = len(audit.load(ledger.ledger_path(stack)))
    consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": "redeliver",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic(ledger.AGGREGATE), 0, 5)])
    record = consumer.poll(30)
    consumer.close()
    assert record is not None and record.error() is None
    # Compressed as the connector's producer writes (test_commands.py reads every batch).
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "compression.type": connector_compression(stack)})
    producer.produce(record.topic(), key=record.key(), value=record.value(), headers=record.headers())
    assert producer.flush(30) == 0
    synced("ledger", "ledger.balances")
    assert len(audit.load(ledger.ledger_path(stack))) == entries_before


def test_the_ledger_rebuilt_from_offset_zero_has_identical_chain_heads(stack, bank_open, spark, synced, tmp_path):
    synced("accounts", "ledger")
    live = audit.heads(audit.load(ledger.ledger_path(stack)))
    rebuilt = dataclasses.replace(stack, lake=tmp_path / "lake")
    fence = fencing.take(spark, rebuilt, ledger.NAME, [])
    ledger.PROJECTION.start(spark, rebuilt, True, fence).awaitTermination()
    assert audit.heads(audit.load(ledger.ledger_path(rebuilt))) == live


def test_an_outbox_event_commits_or_rolls_back_with_its_transaction(stack, bank_open, db, synced):
    """The outbox's point: no event without its state change, and none lost with one."""
    def last_seq():
        return db.execute("SELECT last_seq FROM outbox_sequence WHERE aggregate_type = 'account' "
                          "AND aggregate_id = %s", (str(CUSTOMERS[1]),)).fetchone()[0]

    before = last_seq()
    with Session(bank_open) as session:
        with pytest.raises(RuntimeError):
            with session.begin():
                bank.deposit(session, CUSTOMERS[1], Decimal("5"))
                raise RuntimeError("the application fails before commit")
    assert last_seq() == before  # the rolled-back deposit left no event and took no number
    with Session(bank_open) as session, session.begin():
        bank.deposit(session, CUSTOMERS[1], Decimal("5"))
    assert last_seq() == before + 1
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0  # rows leave at once
    with pytest.raises(Exception, match="refused"):
        db.execute("TRUNCATE outbox")
    synced("accounts", "ledger", "ledger.balances")
