"""The commands over every projection: the runner, status, wait, verify, rebuild, resnapshot.

`all_projections` is the registry they share, in the runner's order: the Kafka-fed
projections first, then those fed by their Delta tables.
"""

from __future__ import annotations

from projections import changelog, mirrors
from projections.event_time import projection as event_time
from projections.ledger import projection as ledger
from projections.views import projection as views
from sync.projection import Projection


def all_projections() -> list[Projection]:
    return [mirrors.PROJECTION, changelog.PROJECTION, ledger.PROJECTION, views.PROJECTION, event_time.PROJECTION]
