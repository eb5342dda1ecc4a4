"""The ledger's hash chain: one chain per account, entry after entry in sequence order.

    hash(entry) = SHA-256( bytes of the previous entry's hash  ||  canonical(entry) )

The first entry of an account follows GENESIS (32 zero bytes). `canonical` is the one
encoding both sides agree on: the projection that writes entries and `ledger verify`
that recomputes them. It is JSON with sorted keys and no spaces, amounts as exact
decimal strings with the currency scale (4 places), and times as UTC ISO-8601 with
microseconds. Every column that says what happened and where it came from is covered,
so changing an amount, a time, an order (seq) or a provenance field breaks the chain
from that entry on. `_applied_at` (when our job ran) is not covered: a rebuild from
offset zero must give the same hashes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Iterable, Iterator

from projections.ledger import SCALE

GENESIS = "0" * 64

# The columns a hash covers, in the ledger table's order (hash columns come last).
HASHED = ("event_id", "account", "seq", "amount", "currency", "event_type", "operation", "operation_id",
          "counterparty", "corrects", "event_time", "recorded_at",
          "_topic", "_partition", "_offset", "_commit_lsn", "_lsn", "_txid")


@dataclass(frozen=True)
class Problem:
    account: int
    seq: int
    event_id: str
    reason: str

    def __str__(self) -> str:
        return f"account {self.account}, entry {self.seq} (event {self.event_id}): {self.reason}"


def _encode(value):
    if isinstance(value, Decimal):
        return format(value.quantize(SCALE), "f")
    if isinstance(value, datetime):
        if value.tzinfo is None:  # Spark and delta-rs hand out UTC; naive means UTC here
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def canonical(entry: dict) -> bytes:
    """The bytes of `entry` that its hash covers (see the module docstring)."""
    return json.dumps({name: _encode(entry[name]) for name in HASHED},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry_hash(prev_hash: str, entry: dict) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + canonical(entry)).hexdigest()


def link(entries: Iterable[dict], prev_hash: str) -> Iterator[dict]:
    """Chain one account's new entries (in seq order) onto `prev_hash`."""
    for entry in entries:
        chained = {**entry, "prev_hash": prev_hash, "hash": entry_hash(prev_hash, entry)}
        prev_hash = chained["hash"]
        yield chained


def check(entries: Iterable[dict]) -> Iterator[Problem]:
    """Recompute every chain. `entries` must be sorted by (account, seq); yields each
    entry that does not follow from the one before it, in that order."""
    account, prev_hash, expected_seq = None, GENESIS, 1
    seen: set[str] = set()
    for entry in entries:
        if entry["account"] != account:
            account, prev_hash, expected_seq = entry["account"], GENESIS, 1
        problem = None
        if entry["seq"] != expected_seq:
            problem = (f"sequence {entry['seq']} where {expected_seq} was expected "
                       "(an entry is missing, repeated or moved)")
        elif entry["event_id"] in seen:
            problem = "event id recorded twice"
        elif entry["prev_hash"] != prev_hash:
            problem = "prev_hash does not match the hash of the entry before it"
        elif entry_hash(prev_hash, entry) != entry["hash"]:
            problem = "hash does not match the entry's content (the entry was altered)"
        if problem:
            yield Problem(entry["account"], entry["seq"], entry["event_id"], problem)
        seen.add(entry["event_id"])
        prev_hash, expected_seq = entry["hash"], entry["seq"] + 1


def heads_digest(heads: Iterable[tuple[int, int, str]]) -> str:
    """One hash over every chain's head (account, seq, hash): covers the whole ledger."""
    digest = hashlib.sha256()
    for account, seq, head in sorted(heads):
        digest.update(f"{account}:{seq}:{head}\n".encode())
    return digest.hexdigest()
