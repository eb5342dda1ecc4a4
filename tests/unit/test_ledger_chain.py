"""The ledger's pure parts: the chain, the posting parser, the auditor's SQL guard."""

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from projections.ledger import audit, chain


def entry(account=7, seq=1, amount="12.5", event_id=None):
    return {"event_id": event_id or f"e-{account}-{seq}", "account": account, "seq": seq,
            "amount": Decimal(amount), "currency": "EUR", "event_type": "credited", "operation": "deposit",
            "operation_id": f"op-{seq}", "counterparty": -1, "corrects": None,
            "event_time": datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=timezone.utc),
            "recorded_at": datetime(2026, 11, 22, 10, 0, 1, 5, tzinfo=timezone.utc),
            "_topic": "lakesync.events.account", "_partition": 0, "_offset": seq, "_commit_lsn": 100 + seq,
            "_lsn": 90 + seq, "_txid": 700 + seq}


def linked(*entries):
    return list(chain.link(entries, chain.GENESIS))


def test_canonical_encoding_is_exact_and_stable():
    encoded = json.loads(chain.canonical(entry(amount="12.5")))
    assert encoded["amount"] == "12.5000"  # the currency scale, never a float
    assert encoded["event_time"] == "2026-11-22T10:00:00.123456Z"
    assert encoded["recorded_at"] == "2026-11-22T10:00:01.000005Z"
    # Equal values give equal bytes however they were spelled or zoned.
    same = {**entry(amount="12.50"), "event_time": datetime(2026, 11, 22, 10, 0, 0, 123456)}
    assert chain.canonical(same) == chain.canonical(entry(amount="12.5"))


def test_a_clean_chain_checks_and_each_kind_of_tampering_is_named():
    good = linked(entry(seq=1), entry(seq=2, amount="-3"), entry(seq=3))
    assert list(chain.check(good)) == []

    edited = [dict(e) for e in good]
    edited[1]["amount"] = Decimal("-300")
    assert [(p.seq, "altered" in p.reason) for p in chain.check(edited)] == [(2, True)]

    assert [p.seq for p in chain.check([good[0], good[2]])] == [3]  # a missing entry

    swapped = [dict(e) for e in good]
    swapped[0]["seq"], swapped[1]["seq"] = 2, 1
    swapped.sort(key=lambda e: e["seq"])
    assert next(chain.check(swapped)).seq == 1  # reordered entries

    twice = linked(entry(seq=1), entry(seq=2, event_id="e-7-1"))
    assert "twice" in next(chain.check(twice)).reason


def test_a_forged_chain_differs_in_its_head():
    good = linked(entry(seq=1), entry(seq=2))
    forged = linked(entry(seq=1), entry(seq=2, amount="999"))
    assert list(chain.check(forged)) == []  # internally consistent ...
    assert audit.digest_of(3, good) != audit.digest_of(3, forged)  # ... but not the same heads


def test_operations_must_sum_to_zero():
    debit = {**entry(account=1, amount="-5"), "operation_id": "t1"}
    credit = {**entry(account=2, amount="5"), "operation_id": "t1"}
    half = {**entry(account=3, amount="5"), "operation_id": "t2"}
    assert audit.unbalanced_operations([debit, credit, half]) == [("t2", Decimal("5"))]


@pytest.mark.parametrize("sql", ["SELECT * FROM ledger", "with x as (select 1) select * from x",
                                 "  -- the balances\nselect account, balance from ledger_balances;",
                                 "select 'delete' as word"])
def test_read_only_queries_pass(sql):
    assert audit.read_only(sql)


@pytest.mark.parametrize("sql, why", [
    ("DELETE FROM ledger", "only SELECT or WITH"),
    ("update ledger set amount = 0", "only SELECT or WITH"),
    ("select 1; drop table ledger", "one statement"),
    ("with x as (delete from ledger returning *) select * from x", "DELETE"),
    ("COPY (select * from ledger) TO '/tmp/out.csv'", "only SELECT or WITH"),
    ("", "one statement"),
    ("SELECT '--' AS x; COPY (SELECT * FROM ledger) TO '/tmp/x.csv'", "one statement"),
    ("WITH a AS (SELECT '--') INSERT INTO ledger SELECT * FROM ledger", "INSERT"),
    ("SELECT $$; DROP TABLE ledger; $$", "dollar"),
    ("SELECT 'unterminated", "unterminated"),
])
def test_anything_else_is_refused_with_the_reason(sql, why):
    with pytest.raises(audit.RefusedQuery, match=why):
        audit.read_only(sql)


def outbox_record(amount="10.25", aggregate_id="7", seq=3, source=True, **payload):
    value = {"schema": {}, "payload": {
        "payload": json.dumps({"operation": "transfer", "operation_id": "op", "account": aggregate_id,
                               "amount": amount, "currency": "EUR", "counterparty": 8, **payload}),
        "event_id": "5f0c1e8e-0000-4000-8000-000000000001", "aggregate_type": "account",
        "aggregate_id": aggregate_id, "seq": seq, "event_type": "credited",
        "occurred_at": "2026-11-22T10:00:00.123456Z"}}
    header = json.dumps({"sequence": '["200","180"]', "lsn": 180, "txId": 901, "ts_us": 1795341600000001})
    return json.dumps(value).encode(), header.encode() if source else None


def test_a_posting_parses_exactly():
    from projections.ledger.projection import parse_posting

    parsed = parse_posting(*outbox_record(), "lakesync.events.account", 0, 42)
    assert parsed["amount"] == Decimal("10.25") and parsed["account"] == 7 and parsed["seq"] == 3
    assert (parsed["_commit_lsn"], parsed["_lsn"], parsed["_txid"], parsed["_offset"]) == (200, 180, 901, 42)
    assert parsed["event_time"] == datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=timezone.utc)
    assert parsed["recorded_at"].microsecond == 1


@pytest.mark.parametrize("record, why", [
    (outbox_record(amount="1.00001"), "not an exact numeric"),
    (outbox_record(amount="NaN"), "not an exact numeric"),
    (outbox_record(amount="ten"), "malformed posting"),
    (outbox_record(aggregate_id="x"), "malformed posting"),
    (outbox_record(source=False), "no `source` header"),
    (outbox_record(currency="EURO"), "3-letter"),
    ((b"not json", None), "not an outbox event"),
    ((None, None), "without a value"),
])
def test_a_malformed_posting_says_why(record, why):
    from projections.ledger.projection import parse_posting

    with pytest.raises(ValueError, match=why):
        parse_posting(*record, "lakesync.events.account", 0, 1)
