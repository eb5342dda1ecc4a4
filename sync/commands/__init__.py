"""The commands over every projection: the runner, status, wait, verify, rebuild, resnapshot.

`all_projections` is the registry they share, in the runner's order: the Kafka-fed
projections first, then those fed by their Delta tables; `projection_named` finds the
projection a command's NAME argument means.
"""

from __future__ import annotations

from projections import changelog, mirrors
from projections.event_time import projection as event_time
from projections.ledger import projection as ledger
from projections.views import projection as views
from sync.errors import LakesyncError
from sync.projection import Projection

# Target names by the projection that keeps them (a mirror's target exists once its
# table has had a change, so names are matched by prefix, not against a listing).
TARGET_PREFIXES = {"mirror.": "mirrors", "ledger.enriched": "views", "ledger.": "ledger", "history.": "views",
                   "view.": "views", "search.": "views", "window.": "event_time", "join.": "event_time",
                   "late.": "event_time", "event_time.": "event_time"}


def all_projections() -> list[Projection]:
    return [mirrors.PROJECTION, changelog.PROJECTION, ledger.PROJECTION, views.PROJECTION, event_time.PROJECTION]


def projection_named(name: str, command: str) -> Projection:
    """The projection NAME means: a projection's name, or one of its targets' names (a
    projection is one query with one checkpoint: `rebuild` and `wait` act on it whole)."""
    by_name = {p.name: p for p in all_projections()}
    found = by_name.get(name) or next((by_name[p] for prefix, p in TARGET_PREFIXES.items() if name.startswith(prefix)),
                                      None)
    if found is None:
        raise LakesyncError(f"no projection or target named {name!r}; {command} one of: "
                            + ", ".join(sorted(by_name)) + " (or a target `lakesync status` lists)")
    return found
