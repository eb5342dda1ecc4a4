"""Projections: what each reads, its key, its target, how it applies a batch, its oracle.

One module per projection, each readable on its own. The runner starts every entry of
PROJECTIONS; `verify` and `status` ask each for its targets. A projection never imports
the command line or the embedded stack: it runs the same on any deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """One Delta table a projection keeps, and the Postgres query it must equal."""

    name: str                 # e.g. mirror.customers (what `rebuild NAME` takes)
    kind: str                 # mirror, history, ledger, view, ...
    table: str                # where the Delta table lives (any Delta reader can open it)
    keys: list[str] = field(default_factory=list)
    oracle_sql: str = ""      # computes the same rows on Postgres
    source: str = ""          # the source table or topic it follows
    target_filter: str = ""   # the Delta rows the oracle covers (e.g. current versions only)
    delta: bool = True        # False: `table` is not a Delta table (a search index's address)


def all_projections():
    from projections import changelog, mirrors
    from projections.event_time import projection as event_time
    from projections.ledger import projection as ledger
    from projections.views import projection as views

    return [mirrors, changelog, ledger, views, event_time]
