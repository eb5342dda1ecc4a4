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
sees the mirrors, the ledger and the changelog as they were together, never one ahead of
another. `lakesync snapshot` prints it.

Independent queries end their batches at different places, and under load those rarely
meet. So the projections of one runner cut their batches at common places
(`Settings.aligned`): each follows the ones before it in that order (`follow`). A batch
that would apply through place M stops at the latest place up to M where each of its
leaders stands, or will once the batch it has decided commits (a leader's decision is
written before its commits, and a replay keeps it), and holds the transactions after
that place for its next batch. It waits, briefly, only for a leader about to decide.

The projections fed by these tables (the views, event time) have no place of their own:
a batch applies the changelog, the ledger and the mirrors as of their points at a place
where they stand together (`together`, `meet`; projections/derived.py), so its tables
then hold exactly what those versions hold. Their points are derived: each
names the versions its batch read (`inputs`), and the projection stands at every place
where each of those tables is at that version (`consistent`).

Each projection's point is one small JSON file, <root>/_points/<projection>/<batch>.json,
written atomically after the batch's commits; the last POINTS_KEPT stay. A batch
replayed after a crash writes its point again, with the same versions (a derived
projection decides what it reads before its commits, and a replay keeps that: `decision`).
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_right
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, NamedTuple

from sync.cdc.transactions import Held, decided
from sync.config import Settings
from sync.delta import catalog
from sync.delta.fencing import Fence
from sync.delta.merge import latest_version
from sync.files import write_json_atomically
from sync.lake import LakePath
from sync.projection import Target

# Per projection: one projection can run this many batches ahead of another (the ledger,
# light, takes a batch a second under load) before their consistent point is lost.
POINTS_KEPT = 1000
# How long a batch waits at most for its leaders to decide past where it would stop
# (`follow`): a leader's read of a batch. A batch that stops short asks for the next one
# (sync/streaming/batch.py step 5), so waiting longer would gain little.
FOLLOW_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Point:
    batch: int
    lsn: int | None             # commit LSN of the last source transaction applied (None: none yet)
    committed_at: str | None    # its commit time in Postgres (UTC, ISO 8601)
    published_at: str           # when the point was written (UTC, ISO 8601)
    tables: dict[str, dict]     # target name -> {"path": ..., "version": ...}
    offset: int | None = None   # that transaction's place in commit order (its END's offset)
    first: int | None = None    # the place of the first transaction concerning the tables this batch applied
    # A derived projection's (no place of its own): table name -> {"path", "version"} of
    # every table its batch read; version None: the table did not exist.
    inputs: dict[str, dict] | None = None


def folder(root: LakePath, projection: str) -> LakePath:
    """Where `projection`'s points are (cleared with its state: sync/delta/catalog.py `clear`)."""
    return root / "_points" / projection


def _is_point(name: str) -> bool:
    """A point's (or a decision's) file name: <batch>.json."""
    return name.endswith(".json") and name[:-5].isdigit()


def _batches(folder: LakePath) -> list[int]:
    try:
        return sorted(int(entry.name[:-5]) for entry in folder.iterdir() if _is_point(entry.name))
    except FileNotFoundError:
        return []


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def tables_now(targets: list[Target]) -> dict[str, dict]:
    """What a point records of `targets`: each one's table and its latest Delta version."""
    return {t.name: {"path": t.table, "version": latest_version(t.table)} for t in targets}


def publish(root: LakePath, projection: str, batch: int, held: Held | None, tables: dict[str, dict], fence: Fence,
            inputs: dict[str, dict] | None = None) -> Point:
    """Write batch `batch`'s point: `tables` as they stand, applied through `held.through`
    (or, for a derived projection, held None: computed from `inputs`).
    Not for a fenced run (a zombie): a batch that applied nothing passed no commit's fence,
    and the versions it would name may be a newer run's, ahead of its place."""
    fence.check()
    through = held.through if held else None
    point = Point(batch=batch, lsn=through.lsn if through else None,
                  committed_at=_iso(through.ts_ms / 1000) if through else None,
                  published_at=_iso(time.time()), tables=tables,
                  offset=through.offset if through else None, first=held.first if held else None, inputs=inputs)
    kept = folder(root, projection)
    write_json_atomically(kept / f"{batch}.json", asdict(point))
    for old in _batches(kept)[:-POINTS_KEPT]:
        (kept / f"{old}.json").unlink(missing_ok=True)
    return point


def decision(root: LakePath, projection: str, batch: int, decide: Callable[[], dict] | None = None) -> dict | None:
    """A derived projection's decision for batch `batch` (what it reads, at which
    versions): `decide()`'s, written before the batch commits anything, or the one its
    first attempt wrote (a replay reads what the commits it skips were computed from).
    Without `decide`: the decision written, if any."""
    kept = folder(root, projection) / "decisions"
    path = kept / f"{batch}.json"
    if path.is_file():
        return json.loads(path.read_text())
    if decide is None:
        return None
    made = decide()
    write_json_atomically(path, made)
    for old in _batches(kept)[:-POINTS_KEPT]:
        (kept / f"{old}.json").unlink(missing_ok=True)
    return made


def decisions(root: LakePath, projection: str, last: int) -> list[dict]:
    """A derived projection's `last` latest decisions, oldest first (one being replaced
    as it is read is left out)."""
    kept = folder(root, projection) / "decisions"
    found = []
    for batch in _batches(kept)[-last:]:
        try:
            found.append(json.loads((kept / f"{batch}.json").read_text()))
        except FileNotFoundError:
            continue
    return found


def _read(folder: LakePath, batch: int) -> Point:
    return Point(**json.loads((folder / f"{batch}.json").read_text()))


# Per points folder: each file's point as last parsed, with the file's identity (inode,
# mtime, size; in a bucket, its ETag for the inode: sync/lake.py). A follower reads its
# leaders' points every batch, and `meet` every 0.2 s while it waits: parsing all of them
# each time cost 28 ms per 1,000 points, 3 ms with this. A file changes only when a
# replayed batch writes its point again (atomically: a new file).
_parsed: dict[LakePath, dict[str, tuple[tuple[int, int, int], Point]]] = {}
_parsed_lock = threading.Lock()


def published(root: LakePath, projection: str) -> list[Point]:
    """The points kept, oldest first."""
    kept = folder(root, projection)
    try:
        entries = [e for e in kept.iterdir() if _is_point(e.name)]
    except FileNotFoundError:
        return []
    with _parsed_lock:
        before = _parsed.get(kept, {})
    now: dict[str, tuple[tuple[int, int, int], Point]] = {}
    for entry in entries:
        try:
            stat = entry.stat()
        except FileNotFoundError:  # (the oldest, just removed by its writer)
            continue
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        cached = before.get(entry.name)
        if cached is not None and cached[0] == identity:
            now[entry.name] = cached
            continue
        try:
            now[entry.name] = (identity, Point(**json.loads(entry.read_text())))
        except FileNotFoundError:
            continue
    with _parsed_lock:
        _parsed[kept] = now
    return [now[name][1] for name in sorted(now, key=lambda name: int(name[:-5]))]


def latest(root: LakePath, projection: str) -> Point | None:
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


def _read_at(tables: dict[str, dict], inputs: dict[str, dict]) -> tuple:
    """Each input table's (path, version) where `tables` stand (None: not there)."""
    return tuple((name, *((tables[name]["path"], tables[name]["version"]) if name in tables else (None, None)))
                 for name in sorted(inputs))


def _derived_index(points: list[Point]) -> dict[frozenset, dict[tuple, Point]]:
    """A derived projection's points by the tables they read (their names, then their
    paths and versions); of two that read the same, the later."""
    index: dict[frozenset, dict[tuple, Point]] = {}
    for point in points:
        if point.inputs is not None:
            read = tuple((name, point.inputs[name]["path"] if point.inputs[name]["version"] is not None else None,
                          point.inputs[name]["version"]) for name in sorted(point.inputs))
            index.setdefault(frozenset(point.inputs), {})[read] = point
    return index


def consistent(kept: dict[str, list[Point]], derived: dict[str, list[Point]] | None = None) -> list[Point]:
    """Every place, oldest first, where each projection's tables are known to stand (see
    the module docstring), as one point each: its tables are every projection's, each at
    its version there, and its batch the first projection's. `kept`: per projection, its
    points oldest first (a projection that has published none is left out). `derived`:
    the same for the projections whose points name their inputs instead of a place; one
    stands where every table it read is at the version it read."""
    placed = {name: [p for p in points if p.offset is not None] for name, points in kept.items()}
    placed = {name: points for name, points in placed.items() if points}
    if not placed:
        return []
    indexes = [_derived_index(points) for points in (derived or {}).values() if points]
    places = {name: [p.offset for p in points] for name, points in placed.items()}
    reached = min(offsets[-1] for offsets in places.values())
    by_place = {p.offset: p for points in placed.values() for p in points}
    found = []
    for place in sorted(offset for offset in by_place if offset <= reached):
        standing = [_standing_at(placed[name], places[name], place) for name in placed]
        if not all(standing):
            continue
        tables = {t: v for p in standing for t, v in p.tables.items()}
        for index in indexes:
            derived_there = [by_read[_read_at(tables, names)] for names, by_read in index.items()
                             if _read_at(tables, names) in by_read]
            if not derived_there:
                break
            standing.append(max(derived_there, key=lambda p: p.batch))
        else:
            at = by_place[place]
            found.append(Point(batch=standing[0].batch, lsn=at.lsn, committed_at=at.committed_at,
                               published_at=max(p.published_at for p in standing),
                               tables={t: v for p in standing for t, v in p.tables.items()}, offset=place))
    return found


class Standing(NamedTuple):
    """A place in commit order, and per projection its point whose tables stand there."""
    place: int
    points: dict[str, Point]


def standing_where(kept: dict[str, list[Point]], table: str, version: int) -> Standing | None:
    """The latest place where every projection of `kept` (its points oldest first) stands
    and `table` is at `version`; None if there is none."""
    return together(kept, table, version, version)


def together(kept: dict[str, list[Point]], table: str, lowest: int, highest: int, after: int | None = None,
             among: Iterable[int] = ()) -> Standing | None:
    """The latest place after `after` where every projection of `kept` stands with `table`
    at a version in [lowest, highest]: of the places `among`, if one is such a place;
    None if there is none."""
    def accept(point: Point) -> bool:
        return table not in point.tables or lowest <= point.tables[table]["version"] <= highest
    placed = {name: [p for p in points if p.offset is not None] for name, points in kept.items()}
    if not all(placed.values()):
        return None
    places = {name: [p.offset for p in points] for name, points in placed.items()}

    def standing_at(place: int) -> dict[str, Point] | None:
        found = {name: _standing_at(points, places[name], place) for name, points in placed.items()}
        return found if all(found.values()) and all(map(accept, found.values())) else None
    for place in sorted((p for p in set(among) if after is None or p > after), reverse=True):
        if standing := standing_at(place):
            return Standing(place, standing)
    reached = max(offset for offsets in places.values() for offset in offsets)
    place = _common_place(kept, after, reached, accept)
    return None if place is None else Standing(place, standing_at(place))


def meet(roots: dict[str, LakePath], table: str, version: int, wait_seconds: float) -> Standing | None:
    """`standing_where` over the points of the projections in `roots` (name -> root),
    waiting up to `wait_seconds` for them to get where `table` is at `version`, but not
    once `table` has moved on and every other one has gone past it without stopping there."""
    deadline = time.monotonic() + wait_seconds
    while True:
        kept = {name: published(root, name) for name, root in roots.items()}
        found = standing_where(kept, table, version)
        if found or time.monotonic() >= deadline:
            return found
        there = [p.offset for points in kept.values() for p in points
                 if p.offset is not None and p.tables.get(table, {}).get("version") == version]
        newest = {name: points[-1] for name, points in kept.items() if points}
        owner = next((p for p in newest.values() if table in p.tables), None)
        if not there or owner is None or len(newest) < len(roots) or (
                owner.tables[table]["version"] != version
                and all(p.offset is not None and p.offset >= max(there) for p in newest.values())):
            return None
        time.sleep(0.2)


def _common_place(kept: dict[str, list[Point]], after: int | None, at_most: int,
                  accept: Callable[[Point], bool] = lambda point: True) -> int | None:
    """The latest place in (after, at_most] where every projection of `kept` (points
    oldest first) stands, at a point `accept` takes; None if there is none."""
    placed = [[p for p in points if p.offset is not None] for points in kept.values()]
    if not all(placed):
        return None
    # Where a projection stands is a union of ranges [offset, next first - 1]: the latest
    # place all of them share is at_most or one of those ranges' ends.
    ends = {at_most} | {p.offset for points in placed for p in points} | \
           {p.first - 1 for points in placed for p in points if p.first is not None}
    places = [[p.offset for p in points] for points in placed]
    for place in sorted((e for e in ends if e <= at_most and (after is None or e > after)), reverse=True):
        standing = [_standing_at(points, offsets, place) for points, offsets in zip(placed, places)]
        if all(standing) and all(map(accept, standing)):
            return place
    return None


def deciding(checkpoint: LakePath, last: Point | None) -> Point | None:
    """A projection's batch that has decided where it stops (sync/cdc/transactions.py
    `decided`, kept for its replay too; its commits under way, or to be replayed after a
    crash) but not yet published after `last`: where it will stand."""
    found = decided(checkpoint)
    if found is None or last is not None and last.batch >= found[0] or found[1].through is None:
        return None
    batch, held = found
    return Point(batch=batch, lsn=held.through.lsn, committed_at=None, published_at="", tables={},
                 offset=held.through.offset, first=held.first)


def follow(leaders: dict[str, tuple[LakePath, LakePath]], after: int | None, at_most: int,
           wait_seconds: float = FOLLOW_WAIT_SECONDS) -> int | None:
    """Where a batch that would apply through place `at_most` (its previous one through
    `after`) stops so as to stand where its `leaders` (projection -> its root and
    checkpoint) stand, or will once their batches that have decided commit: the latest
    such place. It waits up to `wait_seconds` for each leader to decide past `at_most`,
    but not for one still behind `after` (catching up) nor for one committing a batch
    that stops before it (its next decision is a batch away). None: there is none, and
    the batch goes on alone (a point is missed, nothing stalls)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        waiting = False
        for name, (root, checkpoint) in leaders.items():
            last = latest(root, name)
            pending = deciding(checkpoint, last)
            newest = pending or last
            if newest is None:
                return None  # a leader that has decided nothing yet
            reached = -1 if newest.offset is None else newest.offset
            waiting |= reached < at_most and not (after is not None and reached < after) and pending is None
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    kept = {}
    for name, (root, checkpoint) in leaders.items():
        committed = published(root, name)
        pending = deciding(checkpoint, committed[-1] if committed else None)
        kept[name] = committed + ([pending] if pending else [])
    return _common_place(kept, after, at_most)


def aligner(settings: Settings, projection: str) -> Callable[[int | None, int], int | None] | None:
    """The `align` of `projection`'s gate (sync/cdc/transactions.py): `follow` the
    projections before it in `Settings.aligned`; None if it follows none."""
    leaders = settings.aligned[:settings.aligned.index(projection)] if projection in settings.aligned else ()
    if not leaders:
        return None
    places = {name: (catalog.root(settings, name), catalog.checkpoint(settings, name)) for name in leaders}
    return lambda after, at_most: follow(places, after, at_most, FOLLOW_WAIT_SECONDS)
