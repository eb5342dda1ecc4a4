"""Consistent points: a source position and, per table, the Delta version that holds
exactly the source transactions up to it.

Each projection that applies whole source transactions (the mirrors, the ledger:
sync/cdc/transactions.py) publishes its point after every batch: the batch applied
whole transactions only, up to the last one whose END it applied (`offset`, its place in
commit order), and a table the batch did not touch is at that same place. Its tables
then hold the transactions up to any place from `offset` until the first transaction the
next batch applied that concerns them (that batch's `first`).

The consistent point across projections (`consistent`) is the latest place where every
projection's tables are known to stand: a reader that opens each table at its version
(`versionAsOf`, DuckDB's `delta_scan(..., version => v)`, delta-rs' `load_as_version`)
sees the mirrors and the ledger as they were together, never one ahead of another.
`lakesync snapshot` prints it.

Each projection's point is one small JSON file, <root>/_points/<projection>/<batch>.json,
written atomically after the batch's commits; the last POINTS_KEPT stay. A batch
replayed after a crash writes its point again, with the same versions.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from sync.cdc.transactions import Held
from sync.delta.merge import latest_version
from sync.files import write_json_atomically
from sync.projection import Target

# Per projection: one projection can run this many batches ahead of another (the ledger,
# light, takes a batch a second under load) before their consistent point is lost.
POINTS_KEPT = 1000


@dataclass(frozen=True)
class Point:
    batch: int
    lsn: int | None             # commit LSN of the last source transaction applied (None: none yet)
    committed_at: str | None    # its commit time in Postgres (UTC, ISO 8601)
    published_at: str           # when the point was written (UTC, ISO 8601)
    tables: dict[str, dict]     # target name -> {"path": ..., "version": ...}
    offset: int | None = None   # that transaction's place in commit order (its END's offset)
    first: int | None = None    # the place of the first transaction concerning the tables this batch applied


def folder(root: Path, projection: str) -> Path:
    """Where `projection`'s points are (cleared with its state: sync/delta/catalog.py `clear`)."""
    return root / "_points" / projection


def _batches(folder: Path) -> list[int]:
    return sorted(int(p.stem) for p in folder.glob("[0-9]*.json")) if folder.is_dir() else []


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def tables_now(targets: list[Target]) -> dict[str, dict]:
    """What a point records of `targets`: each one's table and its latest Delta version."""
    return {t.name: {"path": t.table, "version": latest_version(t.table)} for t in targets}


def publish(root: Path, projection: str, batch: int, held: Held, tables: dict[str, dict]) -> Point:
    """Write batch `batch`'s point: `tables` as they stand, applied through `held.through`."""
    through = held.through
    point = Point(batch=batch, lsn=through.lsn if through else None,
                  committed_at=_iso(through.ts_ms / 1000) if through else None,
                  published_at=_iso(time.time()), tables=tables,
                  offset=through.offset if through else None, first=held.first)
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


def _standing_at(placed: list[Point], places: list[int], offset: int) -> Point | None:
    """The point of one projection (`placed`: its points that have a place, oldest first;
    `places`: theirs) whose tables hold exactly the source transactions up to place
    `offset`: the last one at or before it, if the next one applied nothing before it;
    None if no point kept says so."""
    at = bisect_right(places, offset) - 1
    if at < 0:
        return None
    point, after = placed[at], placed[at + 1] if at + 1 < len(placed) else None
    if after is None:
        return point if offset == point.offset else None
    return point if after.first is None or offset < after.first else None


def consistent(kept: dict[str, list[Point]]) -> list[Point]:
    """Every place, oldest first, where each projection's tables are known to stand (see
    the module docstring), as one point each: its tables are every projection's, each at
    its version there, and its batch the first projection's. `kept`: per projection, its
    points oldest first (a projection that has published none is left out)."""
    placed = {name: [p for p in points if p.offset is not None] for name, points in kept.items()}
    placed = {name: points for name, points in placed.items() if points}
    if not placed:
        return []
    places = {name: [p.offset for p in points] for name, points in placed.items()}
    reached = min(offsets[-1] for offsets in places.values())
    by_place = {p.offset: p for points in placed.values() for p in points}
    found = []
    for place in sorted(offset for offset in by_place if offset <= reached):
        standing = [_standing_at(placed[name], places[name], place) for name in placed]
        if all(standing):
            at = by_place[place]
            found.append(Point(batch=standing[0].batch, lsn=at.lsn, committed_at=at.committed_at,
                               published_at=max(p.published_at for p in standing),
                               tables={t: v for p in standing for t, v in p.tables.items()}, offset=place))
    return found
