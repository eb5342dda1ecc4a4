"""The demo bank: an application that writes its state and its events in one transaction.

Accounts hold balances (numeric(20,4) in Postgres, Decimal here). Every operation is
double-entry: its postings sum to zero. A deposit credits the customer's account and
debits the bank's cash account for that currency (HOUSE); a withdrawal does the
opposite; a transfer debits one account and credits another of the same currency.

Steps of every operation, in one Postgres transaction:
  1. Lock the accounts involved, in id order (so concurrent operations never deadlock).
  2. Check the rule (enough funds, same currency); break it and nothing is written.
  3. Per posting, in account order: update the balance and `emit` the posting event to
     the outbox (aggregate `account`, id = the account), with the operation's id so the
     ledger can check that its postings sum to zero.
A correction is not an edit: `reverse` posts the opposite amounts as a new operation
that names the one it corrects.

This is application code: it imports SQLAlchemy and sync.outbox, nothing of Spark.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from projections.ledger import AGGREGATE, MAX_AMOUNT, SCALE
from sync.config import sqlalchemy_url
from sync.outbox import emit

HOUSE = {"EUR": -1, "USD": -2}  # the bank's own cash account per currency


class Refused(Exception):
    """The operation breaks a rule of the bank; nothing was written."""


@dataclass(frozen=True)
class Posting:
    account: int
    amount: Decimal


def engine(dsn: str) -> Engine:
    """An engine for a libpq DSN (postgresql://...), through psycopg 3."""
    return create_engine(sqlalchemy_url(dsn), pool_size=8)


def open_house_accounts(session: Session) -> None:
    for currency, account in HOUSE.items():
        session.execute(text("INSERT INTO accounts (id, customer_id, currency, balance) "
                             "VALUES (:id, NULL, :currency, 0) ON CONFLICT (id) DO NOTHING"),
                        {"id": account, "currency": currency})


def deposit(session: Session, account: int, amount: Decimal, occurred_at: datetime | None = None) -> str:
    house = _house(session, account, amount)
    return _post(session, "deposit", [Posting(account, amount), Posting(house, -amount)], occurred_at=occurred_at)


def withdraw(session: Session, account: int, amount: Decimal, occurred_at: datetime | None = None) -> str:
    house = _house(session, account, amount)
    return _post(session, "withdrawal", [Posting(account, -amount), Posting(house, amount)], occurred_at=occurred_at)


def transfer(session: Session, source: int, target: int, amount: Decimal,
             occurred_at: datetime | None = None) -> str:
    if source == target:
        raise Refused("a transfer needs two different accounts")
    if amount <= 0:
        raise Refused(f"a transfer moves a positive amount, not {amount}")
    return _post(session, "transfer", [Posting(source, -amount), Posting(target, amount)], occurred_at=occurred_at)


def reverse(session: Session, operation_id: str, postings: list[Posting]) -> str:
    """The compensating operation for `operation_id` (whose postings are given)."""
    return _post(session, "reversal", [Posting(p.account, -p.amount) for p in postings], corrects=operation_id)


def _house(session: Session, account: int, amount: Decimal) -> int:
    """The bank's cash account on the other side of a deposit or withdrawal."""
    if amount <= 0:
        raise Refused(f"a deposit or withdrawal moves a positive amount, not {amount}")
    currency = session.execute(text("SELECT currency FROM accounts WHERE id = :id"), {"id": account}).scalar()
    if currency is None:
        raise Refused(f"no account {account}")
    if currency not in HOUSE:
        raise Refused(f"the bank keeps no cash in {currency}")
    return HOUSE[currency]


def _post(session: Session, operation: str, postings: list[Posting], corrects: str | None = None,
          occurred_at: datetime | None = None) -> str:
    """Steps 1-3 of the module docstring, for one operation; returns its id. The
    operation happened at `occurred_at` (its postings' event time), by default now."""
    if sum(p.amount for p in postings) != 0:
        raise Refused(f"postings of a {operation} must sum to zero")
    if any(p.amount.quantize(SCALE) != p.amount or p.amount == 0 or abs(p.amount) >= MAX_AMOUNT
           for p in postings):
        raise Refused(f"amounts must be non-zero, below {MAX_AMOUNT} and have at most 4 decimal places")
    ids = sorted({p.account for p in postings})
    accounts = {row.id: row for row in session.execute(
        text("SELECT id, currency, balance FROM accounts WHERE id = ANY(:ids) ORDER BY id FOR UPDATE"),
        {"ids": ids})}
    if len(accounts) != len(ids):
        raise Refused(f"no account {sorted(set(ids) - set(accounts))}")
    if len({accounts[i].currency for i in ids}) != 1:
        raise Refused(f"a {operation} cannot mix currencies")
    for p in postings:
        if p.amount < 0 and p.account not in HOUSE.values() and accounts[p.account].balance + p.amount < 0:
            raise Refused(f"account {p.account} has {accounts[p.account].balance}, not {-p.amount}")
    operation_id = str(uuid.uuid4())
    for p in sorted(postings, key=lambda p: p.account):
        currency = accounts[p.account].currency
        session.execute(text("UPDATE accounts SET balance = balance + :amount WHERE id = :id"),
                        {"amount": p.amount, "id": p.account})
        counterparty = next((q.account for q in postings if q.account != p.account), None)
        emit(session, AGGREGATE, p.account, "credited" if p.amount > 0 else "debited", {
            "operation": operation, "operation_id": operation_id, "account": p.account,
            "amount": p.amount, "currency": currency, "counterparty": counterparty, "corrects": corrects},
             occurred_at=occurred_at)
    return operation_id
