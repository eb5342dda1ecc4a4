"""Per-projection progress the runner leaves for `status`: last batch, rows applied
(and gives to the runner's metrics, sync/streaming/metrics.py).

One small JSON file per projection under <lake>/_progress, replaced atomically after
each batch's commits, so a reader never sees half of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sync.config import Settings
from sync.delta import catalog
from sync.files import read_json, write_json_atomically
from sync.streaming import metrics


@dataclass
class Outcome:
    """What one batch did, per table (keyed as `status` shows the table: the target's
    name after its first dot, or the projection's name)."""

    applied: dict[str, int]                                        # rows the table's commits changed
    dead_letters: dict[str, int] = field(default_factory=dict)     # records set aside
    stopped: dict[str, str] = field(default_factory=dict)          # mirrors stopped, and why
    late_events: dict[str, int] = field(default_factory=dict)      # event time: late events held now
    watermarks: dict[str, str] = field(default_factory=dict)       # event time: each stream's watermark
    held_transactions: int | None = None                           # mirrors: source transactions not yet whole
    stopped_short: bool = False                                    # held whole ones to stand with others (Held)


class Progress:
    def __init__(self, settings: Settings, projection: str):
        self.projection = projection
        self.path = catalog.progress_file(settings, projection)
        self.state: dict[str, Any] = read(settings, projection)

    def record(self, batch_id: int, outcome: Outcome, started: float, step_seconds: dict[str, float]) -> None:
        """After a batch: rows applied, dead letters written and stopped mirrors, per
        table (a table that applied again is no longer stopped); the seconds each step
        took, for a projection that measures its steps; for event time, how many late
        events a table holds now and each stream's watermark."""
        tables = self.state.setdefault("tables", {})
        for table, rows in outcome.applied.items():
            entry = tables.setdefault(table, {"rows_applied": 0})
            entry["rows_applied"] += rows
            entry["last_batch_at"] = time.time()
            entry["last_batch_rows"] = rows
            entry.pop("stopped", None)
        for table, count in outcome.dead_letters.items():
            entry = tables.setdefault(table, {"rows_applied": 0})
            entry["dead_letters"] = entry.get("dead_letters", 0) + count
        for table, count in outcome.late_events.items():
            tables.setdefault(table, {"rows_applied": 0})["late_events"] = count
        if outcome.watermarks:
            self.state["watermarks"] = outcome.watermarks
        if outcome.held_transactions is not None:
            self.state["held_transactions"] = outcome.held_transactions
        for table, reason in outcome.stopped.items():
            tables.setdefault(table, {"rows_applied": 0})["stopped"] = reason
        self.state.update(batch_id=batch_id, last_batch_at=time.time(),
                          last_batch_seconds=round(time.time() - started, 3))
        if step_seconds:
            self.state["last_batch_steps"] = step_seconds
        metrics.observe_batch(self.projection, time.time() - started, outcome.applied, outcome.dead_letters)
        write_json_atomically(self.path, self.state)


def read(settings: Settings, projection: str) -> dict[str, Any]:
    return read_json(catalog.progress_file(settings, projection), {})


class Steps:
    """Seconds per step of one batch, for `status --json` (where a slow batch's time goes).
    A step done several times in a batch (once per table) adds up, also when the tables
    ran at once (then the sum exceeds the batch's time)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._since = time.monotonic()

    def add(self, other: "Steps") -> None:
        """Another clock's seconds (a part of the batch run on a thread of its own)."""
        for step, seconds in other.seconds.items():
            self.seconds[step] = round(self.seconds.get(step, 0.0) + seconds, 3)

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(self.seconds.get(step, 0.0) + now - self._since, 3)
        self._since = now
