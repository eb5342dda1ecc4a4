"""Fencing: two runners of the same projection must never both commit.

A run takes a fencing token, a monotonic epoch per projection, before its queries
start. Steps of `take`, in order:
  1. Claim the next epoch by creating `<lake>/_fencing/<projection>/<epoch>` only if it
     is not there: O_EXCL in a directory, a conditional PUT (If-None-Match) in a bucket
     (sync/lake.py). Of two runs starting at once, one gets N and the other N+1.
  2. If the run before (epoch N-1) closed its fence, skip step 3: it stopped its
     queries before it closed, and any older run was fenced by a stamp already (the
     run after it stamped, or closed in turn). Stamping costs a commit per table: over
     all the projections' tables, half a minute of each start-up on two cores.
  3. Stamp the epoch into every existing target table's properties (`lakesync.epoch`),
     several tables at once. That is a metadata commit: a zombie whose write was already
     under way when the stamp landed fails Delta's conflict check
     (MetadataChangedException) instead of committing.
Before every commit (sync/delta/commit.py) the writer checks that no higher epoch has
been claimed; a zombie finds one and aborts with `Fenced` before writing. A run that
stops its queries cleanly closes its fence (`<epoch>.closed`); one that crashed or was
killed does not, so the run after it stamps.

What is left: a zombie that checks just before a newer run claims its epoch and
commits just after the stamp. It then commits the batch the offset log fixed for it,
the same records the newer run replays, which the transaction ids and the newer-than
guard turn into a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from sync.config import Settings
from sync.delta import catalog
from sync.errors import Fenced
from sync.lake import LakePath

EPOCH_PROPERTY = "lakesync.epoch"


def registry(settings: Settings, projection: str) -> LakePath:
    return catalog.root(settings, projection) / "_fencing" / projection


def latest_epoch(folder: LakePath) -> int:
    try:
        return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=0)
    except FileNotFoundError:  # (a directory not made yet; a bucket's folder lists empty)
        return 0


@dataclass(frozen=True)
class Fence:
    projection: str
    epoch: int
    folder: LakePath

    def check(self) -> None:
        newest = latest_epoch(self.folder)
        if newest > self.epoch:
            raise Fenced(f"projection {self.projection}: fenced, a newer run holds epoch {newest} "
                         f"(this run has {self.epoch}); not committing")

    def close(self) -> None:
        """This run's queries have stopped: the next run need not stamp the tables."""
        (self.folder / f"{self.epoch:012d}.closed").touch()

    @property
    def properties(self) -> dict[str, str]:
        """Table properties a target created by this run starts with."""
        return {EPOCH_PROPERTY: str(self.epoch)}


def take(spark, settings: Settings, projection: str, tables: list[str]) -> Fence:
    """Claim the next epoch of `projection` and stamp it into its existing `tables`."""
    folder = registry(settings, projection)
    folder.mkdir(parents=True, exist_ok=True)
    epoch = latest_epoch(folder) + 1
    while True:
        try:
            (folder / f"{epoch:012d}").touch(exist_ok=False)
            break
        except FileExistsError:
            epoch += 1
    if (folder / f"{epoch - 1:012d}.closed").exists() or epoch == 1:
        return Fence(projection, epoch, folder)
    from concurrent.futures import ThreadPoolExecutor

    from delta.tables import DeltaTable

    def stamp(table: str) -> None:
        if DeltaTable.isDeltaTable(spark, table):  # (one not there yet gets the epoch when created)
            spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('{EPOCH_PROPERTY}' = '{epoch}')")

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(stamp, tables))
    return Fence(projection, epoch, folder)
