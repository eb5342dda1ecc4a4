"""What the projections fed by the changelog and the ledger (the views, event time) share:
what a batch reads, so that their tables stand at a place in commit order too.

They stream both tables (Delta streams, whose batches Spark ends at version boundaries)
and the views read the mirrors. Under load the ledger, which follows the changelog,
stands behind the changelog version a batch has read, so the two streams' ends rarely
meet at one source transaction. So a batch reads the ledger's entries not from its
stream, which only starts batches, but from the ledger as of a point of the ledger's
own (sync/delta/points.py), `Reading`:
  1. The changelog through the last version the batch read whole.
  2. The place where the changelog stands at that version and the ledger (and, for the
     views, the mirrors) stand too, waiting briefly for them to get there (`meet`);
     else the ledger's latest point, and the mirrors as they stand. Never a ledger
     point before a version its stream has handed over: no batch starts for it again.
  3. The ledger's entries of the transactions since the previous batch's through that
     point, chosen by commit position: a transaction's rows carry the commit LSN of the
     one before it (sync/cdc/ordering.py), so those of the transactions up to a point
     are the ones below its commit LSN.
  4. The mirrors and the ledger as of those points' versions, in every step.
  5. After the commits, a derived point naming all of those versions (`publish`): the
     tables stand wherever each of them is at its version.
Decided before the batch commits anything and kept for its replay (`points.decision`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.changelog import NAME as CHANGELOG
from projections.changelog import changelog_path
from projections.ledger import ledger_path
from projections.ledger.projection import NAME as LEDGER
from projections.mirrors import NAME as MIRRORS
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.fencing import Fence
from sync.delta.merge import latest_version, table_exists
from sync.errors import LakesyncError
from sync.projection import Target
from sync.streaming.offsets import whole_versions_read

# How long a batch waits for the ledger (and the mirrors) to stand where the changelog
# version it read stands: the ledger's batch after the changelog's, a second or more.
MEET_WAIT_SECONDS = points.FOLLOW_WAIT_SECONDS
# How long a batch waits at most for the ledger's point of a version it has read (as the
# views wait for the mirrors).
LEDGER_WAIT_SECONDS = 600


class LedgerBehind(LakesyncError):
    exit_code = 1


@dataclass(frozen=True)
class Reading:
    """What one batch reads (see the module docstring)."""

    ledger: dict                      # {"path", "version"}: the ledger's entries are read as of it
    entries_from: int                 # the entries: those whose commit position is in [entries_from, entries_before)
    entries_before: int
    inputs: dict[str, dict] | None    # every table read, at its version: the batch's point (None: none)

    @property
    def pins(self) -> dict[str, dict]:
        """The versions the steps read the mirrors and the ledger at."""
        return self.inputs or {LEDGER: self.ledger}


def reading(settings: Settings, projection: str, batch_id: int, mirrors: list[Target]) -> Reading | None:
    """Batch `batch_id`'s reading (`mirrors`: those it reads). None without whole source
    transactions: no points to read at, and the entries come from the ledger's stream."""
    if not settings.whole_transactions:
        return None
    root = catalog.root(settings, projection)

    def decide() -> dict:
        previous = points.decision(root, projection, batch_id - 1)
        start = previous["entries_before"] if previous else 0
        read = whole_versions_read(catalog.checkpoint(settings, projection), batch_id,
                                   {CHANGELOG: changelog_path(settings), LEDGER: ledger_path(settings)})
        roots = {name: catalog.root(settings, name) for name in (CHANGELOG, LEDGER) + ((MIRRORS,) if mirrors else ())}
        met = read and points.meet(roots, CHANGELOG, read[CHANGELOG]["version"], MEET_WAIT_SECONDS)
        # Every entry the ledger's stream has handed over is read: its stream starts no
        # batch for them again.
        streamed = read[LEDGER]["version"] if read else latest_version(ledger_path(settings))
        if met and met[LEDGER].tables[LEDGER]["version"] < streamed:
            met = None
        ledger = met[LEDGER] if met else _ledger_point(roots[LEDGER], streamed)
        through = ledger.lsn if ledger.lsn is not None else start
        found = Reading(ledger=ledger.tables[LEDGER], entries_from=start, entries_before=max(start, through),
                        inputs=None)
        if read is None or start > through:  # (an earlier batch read entries beyond this point)
            return asdict(found)
        there = met[MIRRORS].tables if met and mirrors else {}
        if mirrors and not met:
            kept = {name: points.published(roots[name], name) for name in (CHANGELOG, MIRRORS)}
            standing = points.standing_where(kept, CHANGELOG, read[CHANGELOG]["version"])
            there = standing[MIRRORS].tables if standing else {}
        if any(t.name not in there and table_exists(t.table) for t in mirrors):
            # No mirrors point there, or one without a table read that exists now: as
            # they stand (a place is found only if they stay so).
            there = {t.name: {"path": t.table, "version": latest_version(t.table)} for t in mirrors
                     if table_exists(t.table)}
        inputs = {t.name: there.get(t.name, {"path": t.table, "version": None}) for t in mirrors}
        return asdict(replace(found, inputs={**inputs, CHANGELOG: read[CHANGELOG], LEDGER: ledger.tables[LEDGER]}))
    return Reading(**points.decision(root, projection, batch_id, decide))


def _ledger_point(root: Path, version: int) -> points.Point:
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
