"""What the projections fed by the changelog and the ledger (the views, event time) share:
what a batch reads, so that their tables stand at a place in commit order too.

They stream both tables (Delta streams, whose batches Spark ends at version boundaries)
and the views read the mirrors. Under load the ledger, which follows the changelog,
stands behind the changelog version a batch has read, and two of these queries read the
changelog through different versions, so the streams' ends rarely meet at one source
transaction, and the two never stand at the same one. So a batch takes what it applies
not from its streams, which only start batches, but from the tables as of a place where
they stand together (sync/delta/points.py), `Reading`:
  1. The place: where the changelog, the ledger (and, for the views, the mirrors) stand
     together, the changelog at a version from the last one an earlier batch applied to
     the last one this batch's stream read whole (`together`). Of those places, first
     one a projection it follows has decided on (event time follows the views), so that
     they stand at the same one; else the one where the changelog is at the version read,
     waiting briefly for the others to get there (`meet`); else the latest. None: the
     ledger's latest point, and the mirrors as they stand (no point).
  2. The changelog's rows of the versions since the last one an earlier batch applied
     through the one at that place (`changes`): the stream's batch, and the versions an
     earlier batch held read again from the changelog's change data feed; what comes
     after the place is held for the next batch, which the batch asks for (as a
     follower of the mirrors does: sync/streaming/batch.py step 5). It holds only while
     a next batch is sure to come, the changelog having a version its stream has not
     read or having decided a batch that writes one (`_next_version`): an idle source's
     transactions add none (changelog.py).
  3. The ledger's entries of the transactions since the previous batch's through that
     place, chosen by commit position: a transaction's rows carry the commit LSN of the
     one before it (sync/cdc/ordering.py), so those of the transactions up to a place are
     the ones below its commit LSN.
  4. The mirrors and the ledger as of those points' versions, in every step.
  5. After the commits, a derived point naming all of those versions (`publish`): the
     tables stand wherever each of them is at its version.
Decided before the batch commits anything and kept for its replay (`points.decision`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.changelog import NAME as CHANGELOG
from projections.changelog import change_feed_from, changelog_path, versions
from projections.ledger import ledger_path
from projections.ledger.projection import NAME as LEDGER
from projections.mirrors import NAME as MIRRORS
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.fencing import Fence
from sync.delta.merge import latest_version, table_exists
from sync.errors import LakesyncError
from sync.lake import LakePath
from sync.projection import Target
from sync.streaming.offsets import whole_versions_read

# How long a batch waits for the ledger (and the mirrors) to stand where the changelog
# version it read stands: the ledger's batch after the changelog's, a second or more.
MEET_WAIT_SECONDS = points.FOLLOW_WAIT_SECONDS
# How long a batch waits at most for the ledger's point of a version it has read (as the
# views wait for the mirrors).
LEDGER_WAIT_SECONDS = 600
# How many of its leader's latest decisions a follower looks among for a place (step 1).
LEADER_DECISIONS = 20


class LedgerBehind(LakesyncError):
    exit_code = 1


@dataclass(frozen=True)
class Reading:
    """What one batch reads (see the module docstring)."""

    ledger: dict                      # {"path", "version"}: the ledger's entries are read as of it
    entries_from: int                 # the entries: those whose commit position is in [entries_from, entries_before)
    entries_before: int
    inputs: dict[str, dict] | None    # every table read, at its version: the batch's point (None: none)
    # The changelog's rows: those of its versions (changes_after, changes_through]. None:
    # not known (a decision of an earlier Lakesync, a stream's batch ending inside a
    # version), and then the rows the stream's batch holds, with those held before it.
    changes_after: int | None = None  # the last version earlier batches applied
    changes_through: int | None = None
    streamed: int | None = None       # the last version the stream's batch read whole
    streamed_before: int | None = None  # the previous batch's
    place: int | None = None          # the place in commit order the batch stands at (None: none)
    # Per input table's path, the last version the batch applied when that is before
    # what its stream read: sync/streaming/offsets.py `processed` counts no further.
    applied: dict[str, int] | None = None

    @property
    def pins(self) -> dict[str, dict]:
        """The versions the steps read the mirrors and the ledger at."""
        return self.inputs or {LEDGER: self.ledger}

    @property
    def holds(self) -> bool:
        """Whether rows the stream's batch read are left for the next batch."""
        return bool(self.applied)


def reading(spark: SparkSession, settings: Settings, projection: str, batch_id: int, mirrors: list[Target],
            follows: tuple[str, ...] = ()) -> Reading | None:
    """Batch `batch_id`'s reading (`mirrors`: those it reads; `follows`: the derived
    projections whose places it stops at first). None without whole source transactions:
    no points to read at, and every row comes from the streams."""
    if not settings.whole_transactions:
        return None
    root = catalog.root(settings, projection)

    def decide() -> dict:
        made = points.decision(root, projection, batch_id - 1)
        previous = Reading(**made) if made else None
        start = previous.entries_before if previous else 0
        read = whole_versions_read(catalog.checkpoint(settings, projection), batch_id,
                                   {CHANGELOG: changelog_path(settings), LEDGER: ledger_path(settings)})
        roots = {name: catalog.root(settings, name) for name in (CHANGELOG, LEDGER) + ((MIRRORS,) if mirrors else ())}
        streamed = read[CHANGELOG]["version"] if read else None
        after = previous.changes_through if previous else None
        there = _place(spark, settings, roots, read, previous, follows) if read else None
        # Every entry the ledger's stream has handed over is read: at the place, or else
        # at a ledger point of that version or later.
        streamed_ledger = read[LEDGER]["version"] if read else latest_version(ledger_path(settings))
        if there and streamed is not None and (
                there.points[CHANGELOG].tables[CHANGELOG]["version"] < streamed
                or there.points[LEDGER].tables[LEDGER]["version"] < streamed_ledger) and not _next_version(
                    settings, streamed, MEET_WAIT_SECONDS):
            # It would hold what its streams read, and no next batch is sure to come (an
            # idle source's transactions add no changelog version: changelog.py), so it
            # applies what it read and stands nowhere.
            there = None
        ledger = there.points[LEDGER] if there else _ledger_point(roots[LEDGER], streamed_ledger)
        through = ledger.lsn if ledger.lsn is not None else start
        changes_through = there.points[CHANGELOG].tables[CHANGELOG]["version"] if there else streamed
        applied = {path: version for path, version, read_through in (
            (changelog_path(settings), changes_through, streamed),
            (ledger.tables[LEDGER]["path"], ledger.tables[LEDGER]["version"], streamed_ledger))
            if read_through is not None and version is not None and version < read_through}
        found = Reading(ledger=ledger.tables[LEDGER], entries_from=start, entries_before=max(start, through),
                        inputs=None, changes_after=after, changes_through=changes_through, streamed=streamed,
                        streamed_before=previous.streamed if previous else None,
                        place=there.place if there else None, applied=applied or None)
        if read is None or start > through:  # (an earlier batch read entries beyond this point)
            return asdict(replace(found, place=None))
        pinned = there.points[MIRRORS].tables if there and mirrors else {}
        if mirrors and not there:
            kept = {name: points.published(roots[name], name) for name in (CHANGELOG, MIRRORS)}
            standing = points.standing_where(kept, CHANGELOG, streamed)
            pinned = standing.points[MIRRORS].tables if standing else {}
        if any(t.name not in pinned and table_exists(t.table) for t in mirrors):
            # No mirrors point there, or one without a table read that exists now: as
            # they stand (a place is found only if they stay so).
            pinned = {t.name: {"path": t.table, "version": latest_version(t.table)} for t in mirrors
                      if table_exists(t.table)}
        inputs = {t.name: pinned.get(t.name, {"path": t.table, "version": None}) for t in mirrors}
        changelog_read = {"path": changelog_path(settings), "version": changes_through}
        return asdict(replace(found, inputs={**inputs, CHANGELOG: changelog_read, LEDGER: ledger.tables[LEDGER]}))
    return Reading(**points.decision(root, projection, batch_id, decide))


def _place(spark: SparkSession, settings: Settings, roots: dict[str, LakePath], read: dict[str, dict],
           previous: Reading | None, follows: tuple[str, ...]) -> points.Standing | None:
    """Step 1: where the batch stands, and the points of its inputs there."""
    streamed = read[CHANGELOG]["version"]
    after = previous.changes_through if previous else None
    # A place before the stream's end holds the versions after it, read again from the
    # changelog's feed: only where the feed has them and an earlier batch's end is known.
    feed = _feed_from(spark, settings)
    lowest = after if after is not None and feed is not None and feed <= after + 1 else streamed
    # A place before the stream's end only if it is past the previous batch's: a batch
    # that would stand still there holds what it read, and its inputs may not meet again
    # for a while (then it applies what it read, and stands nowhere).
    before = previous.place if previous and previous.place is not None else None

    def latest(among: list[int] = ()) -> points.Standing | None:
        kept = {name: points.published(root, name) for name, root in roots.items()}
        return points.together(kept, CHANGELOG, lowest, streamed, before, among)
    among = [d["place"] for name in follows for d in points.decisions(catalog.root(settings, name), name,
                                                                      LEADER_DECISIONS) if d.get("place") is not None]
    chosen = latest(among) if among else None
    if chosen is not None and chosen.place in among:
        return chosen
    met = points.meet(roots, CHANGELOG, streamed, MEET_WAIT_SECONDS)
    if met is not None and (before is None or met.place >= before):
        return met
    return latest()


def _next_version(settings: Settings, streamed: int, wait_seconds: float) -> bool:
    """Whether the changelog will have a version after `streamed`, and so the stream a
    next batch, without another source transaction: it has one, or its query has
    decided a batch that applies a change (written before its commit, and replayed after
    a crash) after the one that made `streamed`. Under load its batch is usually under
    way; between two of them, this waits up to `wait_seconds` for the next decision."""
    path, root = changelog_path(settings), catalog.root(settings, CHANGELOG)
    checkpoint = catalog.checkpoint(settings, CHANGELOG)
    deadline = time.monotonic() + wait_seconds
    while True:
        if latest_version(path) > streamed:
            return True
        last = points.latest(root, CHANGELOG)
        coming = points.deciding(checkpoint, last)
        if last is not None and last.tables[CHANGELOG]["version"] >= streamed and coming and coming.first is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


# The first version of each changelog's change data feed, once read (a table property).
_feeds: dict[str, int] = {}


def _feed_from(spark: SparkSession, settings: Settings) -> int | None:
    path = changelog_path(settings)
    if path not in _feeds:
        found = change_feed_from(spark, path)
        if found is None:  # (not yet: the changelog's query turns it on as it starts)
            return None
        _feeds[path] = found
    return _feeds[path]


def changes(spark: SparkSession, settings: Settings, read: Reading, streamed: DataFrame,
            shape: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """Step 2: the changelog's rows the batch applies, as `shape` makes the changelog's
    rows into the query's (`streamed`: the stream's batch's, so shaped)."""
    again, with_stream = versions_to_read(read)
    if again is None:
        return streamed
    rows = shape(versions(spark, changelog_path(settings), *again))
    return streamed.unionByName(rows, allowMissingColumns=True) if with_stream else rows


def versions_to_read(read: Reading) -> tuple[tuple[int, int] | None, bool]:
    """Which of the changelog's versions (after, through] a batch reads again from its
    feed, if any, and whether it applies its stream's batch too: a batch that stops
    before its stream's end reads every version it applies again (it stops only where
    an earlier batch's end is known); one that does not, the versions an earlier batch
    held, if any, and its stream's."""
    if read.changes_through is not None and read.streamed is not None and read.changes_through < read.streamed:
        return (read.changes_after, read.changes_through), False
    if read.changes_after is not None and read.streamed_before is not None \
            and read.changes_after < read.streamed_before:
        return (read.changes_after, read.streamed_before), True
    return None, True


def _ledger_point(root: LakePath, version: int) -> points.Point:
    """The ledger's latest point, once it names `version` or a later one (a point is
    written just after its batch commits; a stamp's version, at a run's start, once the
    ledger's first batch of the run has published)."""
    deadline = time.monotonic() + LEDGER_WAIT_SECONDS
    while True:
        point = points.latest(root, LEDGER)
        if point is not None and point.tables[LEDGER]["version"] >= version:
            return point
        if time.monotonic() > deadline:
            raise LedgerBehind(f"the ledger has published no point of its version {version} after "
                               f"{LEDGER_WAIT_SECONDS} s; the views and event time read its entries at one")
        time.sleep(0.2)


def entries(spark: SparkSession, read: Reading) -> DataFrame:
    """The ledger's entries `read` names."""
    return (spark.read.format("delta").option("versionAsOf", read.ledger["version"]).load(read.ledger["path"])
            .where((F.col("_commit_lsn") >= read.entries_from) & (F.col("_commit_lsn") < read.entries_before)))


def publish(settings: Settings, projection: str, batch_id: int, read: Reading | None, targets: list[Target],
            fence: Fence) -> None:
    """The batch's point, after its commits: its tables as they stand, and what it read."""
    if read is not None and read.inputs:
        points.publish(catalog.root(settings, projection), projection, batch_id, None,
                       points.tables_now([t for t in targets if t.delta]), fence, inputs=read.inputs)
