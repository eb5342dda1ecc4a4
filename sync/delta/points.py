"""Consistent points: a source position and, per table, the Delta version that holds
exactly the source transactions up to it.

The mirrors publish one after every batch (projections/mirrors.py): the batch has
applied whole source transactions only, up to the last one whose END it applied
(sync/cdc/transactions.py), and a mirror the batch did not touch is at that same point.
A reader that opens each table at its version (`versionAsOf`, DuckDB's
`delta_scan(..., version => v)`, delta-rs' `load_as_version`) sees the mirrors as they
were together, never one ahead of another. `lakesync snapshot` prints the latest.

Each point is one small JSON file, <root>/_points/<projection>/<batch>.json, written
atomically after the batch's commits; the last POINTS_KEPT stay. A batch replayed after a
crash writes its point again, with the same versions.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from sync.cdc.transactions import End
from sync.files import write_json_atomically

POINTS_KEPT = 100


@dataclass(frozen=True)
class Point:
    batch: int
    lsn: int | None             # commit LSN of the last source transaction applied (None: none yet)
    committed_at: str | None    # its commit time in Postgres (UTC, ISO 8601)
    published_at: str           # when the point was written (UTC, ISO 8601)
    tables: dict[str, dict]     # target name -> {"path": ..., "version": ...}


def folder(root: Path, projection: str) -> Path:
    """Where `projection`'s points are (cleared with its state: sync/delta/catalog.py `clear`)."""
    return root / "_points" / projection


def _batches(folder: Path) -> list[int]:
    return sorted(int(p.stem) for p in folder.glob("[0-9]*.json")) if folder.is_dir() else []


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def publish(root: Path, projection: str, batch: int, through: End | None, tables: dict[str, dict]) -> Point:
    """Write batch `batch`'s point: `tables` as they stand, applied `through` a source transaction."""
    point = Point(batch=batch, lsn=through.lsn if through else None,
                  committed_at=_iso(through.ts_ms / 1000) if through else None,
                  published_at=_iso(time.time()), tables=tables)
    kept = folder(root, projection)
    write_json_atomically(kept / f"{batch}.json", asdict(point))
    for old in _batches(kept)[:-POINTS_KEPT]:
        (kept / f"{old}.json").unlink(missing_ok=True)
    return point


def _read(folder: Path, batch: int) -> Point:
    return Point(**json.loads((folder / f"{batch}.json").read_text()))


def published(root: Path, projection: str) -> list[Point]:
    """The points kept, oldest first."""
    kept = folder(root, projection)
    return [_read(kept, batch) for batch in _batches(kept)]


def latest(root: Path, projection: str) -> Point | None:
    kept = folder(root, projection)
    batches = _batches(kept)
    return _read(kept, batches[-1]) if batches else None
