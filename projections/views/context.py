"""The typed hand-over between the views projection and its four views."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from projections.ledger import ledger_path
from projections.ledger.projection import NAME as LEDGER
from projections.mirrors import target as mirror_target
from sync.config import Settings
from sync.delta.commit import BatchCommit
from sync.delta.merge import table_exists


@dataclass(frozen=True)
class Contents:
    """What a batch holds, from the one aggregate the projection runs over it anyway: the
    source tables it has changes of (`customers`, ...), whether it has ledger entries,
    and its latest source position. A view whose inputs the batch does not hold skips
    its step without running a Spark job to find that out."""

    tables: frozenset[str]
    entries: bool
    high: tuple[int | None, int | None] | None  # (commit LSN, LSN) of its latest change; None without changes


class Context:
    """What one batch hands each view: the session, the batch's commit, its changes and
    entries, what it holds (`contents`), the mirrors and the ledger as of the versions the
    batch reads them at (`pins`, projections/derived.py; one not pinned: as it stands at
    each call), and the views as they stand.

    Every view is a module with `NAME`, `path`, `targets` and `ensure`; the views
    projection (projection.py) runs their steps in its order, each committing through
    `commit` with txnAppId `views:<NAME>`."""

    def __init__(self, commit: BatchCommit, settings: Settings, changes: DataFrame, entries: DataFrame,
                 contents: Contents, pins: dict[str, dict] | None):
        self.commit, self.spark, self.settings = commit, commit.spark, settings
        self.changes, self.entries, self.contents, self.pins = changes, entries, contents, pins or {}
        self.read_as_of: dict[tuple[str, int], DataFrame] = {}  # each pinned table read once (`_as_of`)
        self.history_changed: DataFrame | None = None   # set by customer_history: id, first new position
        self.orders_changed: DataFrame | None = None    # set by order_docs: customer ids old and new
        self.docs_after: DataFrame | None = None        # set by order_docs: documents once written

    def holds(self, *tables: str) -> bool:
        """Whether the batch has changes of any of `tables`."""
        return not self.contents.tables.isdisjoint(tables)

    def changes_of(self, table: str) -> DataFrame:
        return self.changes.where(F.col("table") == f"public.{table}")

    def mirror(self, table: str, columns: str) -> DataFrame:
        """The mirror's `columns` (a DDL list, provenance included as needed); empty when
        the table has had no row yet (no mirror is created before its first change)."""
        wanted = self.spark.createDataFrame([], columns)
        pinned = self.pins.get(mirror_target(self.settings, table).name)
        if pinned is not None:
            if pinned["version"] is None:
                return wanted
            return self._as_of(pinned).select(*wanted.columns)
        path = mirror_target(self.settings, table).table
        if not table_exists(path):
            return wanted
        return self.spark.read.format("delta").load(path).select(*wanted.columns)

    def ledger(self) -> DataFrame:
        """The ledger as of the version the batch read its entries through."""
        pinned = self.pins.get(LEDGER)
        return self._as_of(pinned) if pinned else self.view(ledger_path(self.settings))

    def view(self, path: str) -> DataFrame:
        return self.spark.read.format("delta").load(path)

    def _as_of(self, table: dict) -> DataFrame:
        """One read per table and version: a version older than the latest is a snapshot
        Delta reconstructs at each new read (0.6-0.7 s for a small mirror here, against
        0.15-0.2 s to query the same read again), and under load the pins are older."""
        key = (table["path"], table["version"])
        if key not in self.read_as_of:
            self.read_as_of[key] = (self.spark.read.format("delta").option("versionAsOf", table["version"])
                                    .load(table["path"]))
        return self.read_as_of[key]
