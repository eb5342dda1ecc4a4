"""Per-projection progress the runner leaves for `status`: last batch, rows applied
(and gives to the runner's metrics, sync/streaming/metrics.py).

One small JSON file per projection under <lake>/_progress, replaced atomically after
each batch's commits, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from sync.delta import catalog
from sync.streaming import metrics
from sync.config import Settings


class Progress:
    def __init__(self, settings: Settings, projection: str):
        self.projection = projection
        self.path = catalog.progress_file(settings, projection)
        self.state: dict[str, Any] = read(settings, projection)

    def record(self, batch_id: int, applied_by_table: dict[str, int], started: float,
               dead_letters_by_table: dict[str, int] | None = None,
               stopped_by_table: dict[str, str] | None = None,
               step_seconds: dict[str, float] | None = None,
               late_events_by_table: dict[str, int] | None = None,
               watermarks: dict[str, str] | None = None) -> None:
        """After a batch: rows applied, dead letters written and stopped mirrors, per
        table (a table that applied again is no longer stopped); the seconds each step
        took, for a projection that measures its steps; for event time, how many late
        events a table holds now and each stream's watermark."""
        tables = self.state.setdefault("tables", {})
        for table, rows in applied_by_table.items():
            entry = tables.setdefault(table, {"rows_applied": 0})
            entry["rows_applied"] += rows
            entry["last_batch_at"] = time.time()
            entry["last_batch_rows"] = rows
            entry.pop("stopped", None)
        for table, count in (dead_letters_by_table or {}).items():
            entry = tables.setdefault(table, {"rows_applied": 0})
            entry["dead_letters"] = entry.get("dead_letters", 0) + count
        for table, count in (late_events_by_table or {}).items():
            tables.setdefault(table, {"rows_applied": 0})["late_events"] = count
        if watermarks:
            self.state["watermarks"] = watermarks
        for table, reason in (stopped_by_table or {}).items():
            tables.setdefault(table, {"rows_applied": 0})["stopped"] = reason
        self.state.update(batch_id=batch_id, last_batch_at=time.time(),
                          last_batch_seconds=round(time.time() - started, 3))
        if step_seconds:
            self.state["last_batch_steps"] = step_seconds
        metrics.observe_batch(self.projection, time.time() - started, applied_by_table, dead_letters_by_table or {})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)


def read(settings: Settings, projection: str) -> dict[str, Any]:
    try:
        return json.loads(catalog.progress_file(settings, projection).read_text())
    except (OSError, ValueError):
        return {}


class Steps:
    """Seconds per step of one batch, for `status --json` (where a slow batch's time goes).
    A step done several times in a batch (once per table) adds up."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._since = time.monotonic()

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(self.seconds.get(step, 0.0) + now - self._since, 3)
        self._since = now
