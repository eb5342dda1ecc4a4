"""The ledger's batch function and the auditor's checks on real Spark and Delta.

Each test hands the batch function the rows the Kafka source would give it (with the
`source` header the connector adds), so redelivery, conflicts, gaps, crash replays and
tampering are tested on exact inputs. The whole path from Postgres is in tests/e2e.
"""

import dataclasses
import json
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from projections.ledger import audit, chain
from projections.ledger import projection as ledger
from sync import config
from sync.cdc import transactions
from sync.delta import catalog, deadletters, fencing, points
from sync.streaming.offsets import latest_version

pytestmark = pytest.mark.spark

TOPIC = "lakesync.events.account"
RECORDS = ("key binary, value binary, topic string, partition int, offset bigint, "
           "headers array<struct<key: string, value: binary>>")


def posting(account, seq, amount, operation_id="op", event_id=None, txid=None):
    event_id = event_id or str(uuid.uuid5(uuid.NAMESPACE_OID, f"{account}/{seq}"))
    value = {"schema": {}, "payload": {
        "payload": json.dumps({"operation": "transfer", "operation_id": operation_id, "account": account,
                               "amount": amount, "currency": "EUR", "counterparty": None}),
        "event_id": event_id, "aggregate_type": "account", "aggregate_id": str(account), "seq": seq,
        "event_type": "credited", "occurred_at": f"2026-11-22T10:00:{seq:02d}.000001Z"}}
    tx = txid or 1000 + seq
    source = {"sequence": json.dumps([str(tx * 10), str(tx * 10 + 1)]), "lsn": tx * 10 + 1, "txId": tx,
              "ts_us": 1795341600000000 + seq}
    return str(account).encode(), json.dumps(value).encode(), json.dumps(source).encode()


def end(txid, events, offset):
    """The END record of source transaction `txid`, which emitted `events` events: END counts
    each event's outbox insert and delete, and its sequence table change (sync/outbox.py)."""
    payload = {"status": "END", "id": f"{txid}:{txid * 10 + 5}", "event_count": 3 * events, "ts_ms": 1795341600000,
               "data_collections": [{"data_collection": "public.outbox", "event_count": 2 * events},
                                    {"data_collection": "public.outbox_sequence", "event_count": events}]}
    return (json.dumps({"payload": {"id": payload["id"]}}).encode(), json.dumps({"schema": {}, "payload": payload}).encode(),
            transactions.TRANSACTIONS_TOPIC, 0, offset, None)


def headers(source, transaction=True):
    """A routed event's headers (jvm/smt SourceToHeader): its change's source and transaction blocks."""
    block = json.loads(source)
    return [("id", b"x"), ("source", source)] + ([("transaction", json.dumps(
        {"id": f"{block['txId']}:{block['lsn']}", "total_order": 1, "data_collection_order": 1}).encode())]
        if transaction else [])


def batch(spark, postings, first_offset=0, ends=None, topic=TOPIC, transaction=True):
    """The records of `postings` from `first_offset`, and at the same offsets of the
    transaction topic an END for each of their transactions (or for those in `ends`)."""
    rows = [(k, v, topic, 0, first_offset + i, headers(s, transaction)) for i, (k, v, s) in enumerate(postings)]
    counts = Counter(json.loads(s)["txId"] for _, _, s in postings)
    rows += [end(txid, n, first_offset + i)
             for i, (txid, n) in enumerate(sorted((counts if ends is None else ends).items()))]
    return spark.createDataFrame(rows, RECORDS)


@pytest.fixture
def settings(tmp_path, request):
    """A lake in a directory; in a bucket of the tests' S3 server for a test parametrized
    `settings` = "bucket" (sync/lake.py)."""
    where = request.getfixturevalue("bucket_lake") if getattr(request, "param", "") == "bucket" else tmp_path / "lake"
    return dataclasses.replace(config.load(), lake=where)


def new_run(spark, settings):
    return ledger.LedgerBatch(settings, fencing.take(spark, settings, ledger.NAME, []))


def entries(settings):
    return audit.load(ledger.ledger_path(settings))


def balances(spark, settings):
    return {r["account"]: (r["balance"], r["last_seq"])
            for r in spark.read.format("delta").load(ledger.balances_path(settings)).collect()}


def dead(spark, settings):
    return [r["error"] for r in spark.read.format("delta").load(deadletters.path(settings, "ledger")).collect()]


@pytest.mark.parametrize("settings", ["directory", "bucket"], indirect=True)
def test_redelivered_events_never_make_a_second_entry(spark, settings):
    """In a directory and in a bucket, where the auditor's reader (delta-rs) and its check
    of the data files read the ledger from the store."""
    run = new_run(spark, settings)
    first = [posting(7, 1, "10.00", "a"), posting(8, 1, "-10.00", "a"), posting(7, 2, "2.5", "b"),
             posting(8, 2, "-2.5", "b")]
    run(batch(spark, first + [first[0]]), 0)  # a repeat inside the batch too
    # A later batch redelivers everything (a Connect crash), plus one new event each.
    run(batch(spark, first + [posting(7, 3, "1", "c"), posting(8, 3, "-1", "c")], 10), 1)
    got = entries(settings)
    assert [(e["account"], e["seq"]) for e in got] == [(7, 1), (7, 2), (7, 3), (8, 1), (8, 2), (8, 3)]
    assert list(chain.check(got)) == [] and audit.unbalanced_operations(got) == []
    assert balances(spark, settings) == {7: (Decimal("13.5"), 3), 8: (Decimal("-13.5"), 3)}
    # The auditor's reader (delta-rs) reads both tables.
    assert audit.query(settings, "SELECT account, balance FROM ledger_balances ORDER BY account")[1] == [
        (7, Decimal("13.5000")), (8, Decimal("-13.5000"))]
    assert got[0]["amount"] == Decimal("10.0000") and got[0]["_txid"] == 1001
    problems, summary = audit.verify(ledger.ledger_path(settings), balances=ledger.balances_path(settings))
    assert problems == [] and summary["entries"] == 6


def test_a_conflicting_or_gapped_event_goes_to_the_dead_letters(spark, settings):
    run = new_run(spark, settings)
    run(batch(spark, [posting(7, 1, "5", "a"), posting(7, 2, "5", "b")]), 0)
    impostor = posting(7, 2, "500", "x", event_id=str(uuid.uuid4()))
    run(batch(spark, [impostor, posting(7, 4, "1", "y")], 10), 1)
    assert len(entries(settings)) == 2
    errors = sorted(dead(spark, settings))
    assert "already event" in errors[0] and "sequence gap" in errors[1]
    assert balances(spark, settings)[7] == (Decimal("10"), 2)


def test_a_crash_between_ledger_and_balances_is_made_good_on_replay(spark, settings, monkeypatch):
    run = new_run(spark, settings)
    run(batch(spark, [posting(7, 1, "5", "a")]), 0)

    def crash(*args):
        raise RuntimeError("killed between the ledger's commit and the balances' commit")

    monkeypatch.setattr(ledger.LedgerBatch, "_merge_balances", crash)
    with pytest.raises(RuntimeError):
        run(batch(spark, [posting(7, 2, "3", "b")], 1), 1)
    monkeypatch.undo()
    assert len(entries(settings)) == 2 and balances(spark, settings)[7] == (Decimal("5"), 1)
    # The restarted run replays batch 1: the ledger commit is skipped, the balance catches up.
    new_run(spark, settings)(batch(spark, [posting(7, 2, "3", "b")], 1), 1)
    assert len(entries(settings)) == 2 and balances(spark, settings)[7] == (Decimal("8"), 2)


def test_delta_refuses_update_and_delete_on_the_ledger(spark, settings):
    new_run(spark, settings)(batch(spark, [posting(7, 1, "5")]), 0)
    path = ledger.ledger_path(settings)
    for statement in (f"DELETE FROM delta.`{path}` WHERE account = 7",
                      f"UPDATE delta.`{path}` SET amount = 0 WHERE account = 7"):
        with pytest.raises(Exception, match="(?i)append"):
            spark.sql(statement)
    assert len(entries(settings)) == 1


def test_a_rebuild_gives_identical_chain_heads(spark, settings, tmp_path):
    feed = [[posting(a, s, f"{a}.{s}", f"op{s}") for a in (1, 2, 3)] for s in range(1, 4)]
    for number, postings in enumerate(feed):
        new_run(spark, settings)(batch(spark, postings, number * 3), number)
    rebuilt = dataclasses.replace(settings, lake=tmp_path / "rebuilt")
    new_run(spark, rebuilt)(batch(spark, [p for postings in feed for p in postings]), 0)  # one big batch
    assert audit.heads(entries(settings)) == audit.heads(entries(rebuilt))


def test_a_batch_appends_whole_source_transactions_only(spark, settings):
    """Operation 50 emits two postings and an order event (another aggregate type, another
    topic); 60's END comes before its second posting. No version of the ledger or of its
    balances holds part of an operation (sync/cdc/transactions.py)."""
    kafka = {}  # (topic, offset) -> record: what Kafka keeps, read again for the held ranges

    def kept(frame):
        for row in frame.collect():
            kafka[(row["topic"], row["offset"])] = tuple(row)
        return frame

    def read_again(session, ranges):
        return session.createDataFrame(
            [r for (topic, offset), r in sorted(kafka.items())
             if (topic, 0) in ranges and ranges[(topic, 0)][0] <= offset < ranges[(topic, 0)][1]], RECORDS)

    run = ledger.LedgerBatch(settings, fencing.take(spark, settings, ledger.NAME, []), read_again)
    order_event = posting(99, 1, "0", "50", txid=50)
    run(kept(batch(spark, [posting(7, 1, "10", "50", txid=50)], ends={50: 3})), 0)
    assert entries(settings) == []
    run(kept(batch(spark, [posting(8, 1, "-10", "50", txid=50), posting(7, 2, "1", "60", txid=60)], 1,
                   ends={60: 2}).union(batch(spark, [order_event], 0, ends={}, topic="lakesync.events.order"))), 1)
    assert [(e["account"], e["seq"]) for e in entries(settings)] == [(7, 1), (8, 1)]
    # 60's last posting, and 50's first again (Kafka holding it twice): it is known applied.
    run(kept(batch(spark, [posting(8, 2, "-1", "60", txid=60), posting(7, 1, "10", "50", txid=50)], 3, ends={})), 2)
    assert [(e["account"], e["seq"]) for e in entries(settings)] == [(7, 1), (7, 2), (8, 1), (8, 2)]
    assert transactions.held_after(catalog.checkpoint(settings, ledger.NAME), 2).xids == set()
    for path in (ledger.ledger_path(settings), ledger.balances_path(settings)):
        for version in range(latest_version(path) + 1):
            rows = spark.read.format("delta").option("versionAsOf", version).load(path).collect()
            if path == ledger.ledger_path(settings):
                assert audit.unbalanced_operations([r.asDict() for r in rows]) == []
            else:
                assert sum(r["balance"] for r in rows) == 0
    point = points.latest(catalog.root(settings, ledger.NAME), ledger.NAME)  # sync/delta/points.py
    assert (point.batch, point.offset, point.lsn, point.first) == (2, 1, 605, 1)
    assert {name: t["version"] for name, t in point.tables.items()} == {
        "ledger": latest_version(ledger.ledger_path(settings)),
        "ledger.balances": latest_version(ledger.balances_path(settings))}
    # An event written before the connector gave transaction metadata has no END to wait for.
    run(kept(batch(spark, [posting(9, 1, "3", "70", txid=70)], 4, ends={}, transaction=False)), 3)
    assert (9, 1) in [(e["account"], e["seq"]) for e in entries(settings)]


# -- tampering: what `lakesync ledger verify` must catch --

@pytest.fixture
def sealed(spark, settings):
    """A ledger of two accounts over two commits, and its digest."""
    run = new_run(spark, settings)
    run(batch(spark, [posting(7, 1, "5", "a"), posting(8, 1, "-5", "a")]), 0)
    run(batch(spark, [posting(7, 2, "2", "b"), posting(8, 2, "-2", "b")], 2), 1)
    path = ledger.ledger_path(settings)
    assert audit.verify(path)[0] == []
    digest, _ = audit.digest(path)
    return path, digest


def data_files(path):
    return sorted(Path(path).glob("*.parquet"), key=lambda f: f.stat().st_mtime)


def rewrite(file, change):
    rows = pq.read_table(file).to_pylist()
    change(rows)
    schema = pq.read_schema(file)
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows, schema=schema), file)


def test_an_edited_amount_is_detected(sealed):
    path, _ = sealed
    rewrite(data_files(path)[0], lambda rows: rows[0].update(amount=Decimal("5000.0000")))
    problems, _ = audit.verify(path)
    assert problems and "data file" in problems[0]


def test_a_deleted_data_file_is_detected(sealed):
    path, _ = sealed
    data_files(path)[0].unlink()
    problems, _ = audit.verify(path)
    assert problems and "missing" in problems[0]


def test_reordered_entries_are_detected(sealed):
    path, _ = sealed
    files = data_files(path)
    # Swap the order of account 7's two entries across the two files (sizes may even match).
    rewrite(files[0], lambda rows: [r.update(seq=2) for r in rows if r["account"] == 7])
    rewrite(files[1], lambda rows: [r.update(seq=1) for r in rows if r["account"] == 7])
    problems, _ = audit.verify(path)
    assert problems


def test_a_forged_replacement_file_is_caught_by_the_digest(sealed):
    """The strongest forger: knows the hash algorithm, recomputes every hash, and writes
    a Delta commit of their own that swaps the real file for the forged one, so the log
    lists the forged file with its true size. Only the digest can tell."""
    path, digest = sealed
    real = data_files(path)[-1]
    heads = {e["account"]: e["hash"] for e in audit.load(path) if e["seq"] == 1}
    rows = pq.read_table(real).to_pylist()
    for row in rows:
        row["amount"] = row["amount"] * 100
        row["prev_hash"] = heads[row["account"]]
        row["hash"] = chain.entry_hash(row["prev_hash"], row)
    forged = real.with_name(f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(real)), forged)
    log = Path(path) / "_delta_log"
    version = max(int(f.stem) for f in log.glob("*.json")) + 1
    now = int(forged.stat().st_mtime * 1000)
    actions = [{"remove": {"path": real.name, "deletionTimestamp": now, "dataChange": True}},
               {"add": {"path": forged.name, "partitionValues": {}, "size": forged.stat().st_size,
                        "modificationTime": now, "dataChange": True}}]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")

    assert audit.verify(path)[0] == []  # files and chains are consistent ...
    problems, _ = audit.verify(path, digest)  # ... but not with what the digest sealed
    assert problems and "digest" in problems[0]
