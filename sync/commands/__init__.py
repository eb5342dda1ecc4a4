"""The commands over every projection: the runner, status, wait, verify, rebuild, resnapshot.

`all_projections` is the registry they share, in the runner's order: the Kafka-fed
projections first, then those fed by their Delta tables, each of them only if
LAKESYNC_PROJECTIONS names it; `projection_named` finds the projection a command's NAME
argument means.
"""

from __future__ import annotations

from projections import changelog, mirrors
from projections.event_time import projection as event_time
from projections.ledger import projection as ledger
from projections.views import projection as views
from sync.config import Settings
from sync.errors import LakesyncError
from sync.projection import Projection

# Target names by the projection that keeps them (a mirror's target exists once its
# table has had a change, so names are matched by prefix, not against a listing).
TARGET_PREFIXES = {"mirror.": "mirrors", "ledger.enriched": "views", "ledger.": "ledger", "history.": "views",
                   "view.": "views", "search.": "views", "window.": "event_time", "join.": "event_time",
                   "late.": "event_time", "event_time.": "event_time"}


REGISTRY = [mirrors.PROJECTION, changelog.PROJECTION, ledger.PROJECTION, views.PROJECTION, event_time.PROJECTION]
# What a projection reads of the others' tables: it runs only beside them.
READS = {"views": ("mirrors", "changelog", "ledger"), "event_time": ("changelog", "ledger")}


def all_projections(settings: Settings) -> list[Projection]:
    """The projections LAKESYNC_PROJECTIONS names (by default all), in the runner's order;
    a name it does not know, or a projection without those it reads: one line."""
    known = [p.name for p in REGISTRY]
    unknown = [name for name in settings.projections if name not in known]
    if unknown:
        raise LakesyncError(f"LAKESYNC_PROJECTIONS: no projection named {', '.join(unknown)}; "
                            f"known: {', '.join(known)}")
    for name in settings.projections:
        missing = [needed for needed in READS.get(name, ()) if needed not in settings.projections]
        if missing:
            raise LakesyncError(f"LAKESYNC_PROJECTIONS: {name} reads {', '.join(missing)}: name them too")
    return [p for p in REGISTRY if p.name in settings.projections]


def projection_named(settings: Settings, name: str, command: str) -> Projection:
    """The projection NAME means: a projection's name, or one of its targets' names (a
    projection is one query with one checkpoint: `rebuild` and `wait` act on it whole)."""
    by_name = {p.name: p for p in all_projections(settings)}
    found = by_name.get(name) or next((by_name[p] for prefix, p in TARGET_PREFIXES.items()
                                       if name.startswith(prefix) and p in by_name), None)
    if found is None:
        raise LakesyncError(f"no projection or target named {name!r}; {command} one of: "
                            + ", ".join(sorted(by_name)) + " (or a target `lakesync status` lists)")
    return found
