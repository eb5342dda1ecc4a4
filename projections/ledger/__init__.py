"""The ledger: the streaming projection that writes it (projection.py), its hash chain
(chain.py) and the auditor's commands (audit.py); this module holds what all three share.

Neither chain.py nor audit.py (nor this module) needs Spark: the chain is plain Python,
shared by the projection that writes the ledger and the auditor who checks it, and the
auditor reads the Delta table with delta-rs, so `lakesync ledger ...` starts in a second
and only ever reads.
"""

from __future__ import annotations

from decimal import Decimal

from sync.config import Settings
from sync.delta import catalog

AGGREGATE = "account"                # the outbox aggregate type whose events are postings
SCALE = Decimal("0.0001")            # amounts are numeric(20,4), in Postgres and in Delta
MAX_AMOUNT = Decimal(10) ** 16


def ledger_path(settings: Settings) -> str:
    """Where the ledger lives (any Delta reader can open it)."""
    return str(catalog.root(settings, "ledger") / "ledger")


def balances_path(settings: Settings) -> str:
    return str(catalog.root(settings, "ledger") / "ledger_balances")
