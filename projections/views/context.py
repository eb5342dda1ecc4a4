"""The typed hand-over between the views projection and its four views."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from projections.mirrors import mirror_path
from sync.config import Settings
from sync.delta.commit import BatchCommit


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
    entries, what it holds (`contents`), and the mirrors and views as they stand (read
    fresh at each call).

    Every view is a module with `NAME`, `path`, `targets` and `ensure`; the views
    projection (projection.py) runs their steps in its order, each committing through
    `commit` with txnAppId `views:<NAME>`."""

    def __init__(self, commit: BatchCommit, settings: Settings, changes: DataFrame, entries: DataFrame,
                 contents: Contents):
        self.commit, self.spark, self.settings = commit, commit.spark, settings
        self.changes, self.entries, self.contents = changes, entries, contents
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
        path = mirror_path(self.settings, table)
        wanted = self.spark.createDataFrame([], columns)
        if not (path / "_delta_log").is_dir():
            return wanted
        return self.spark.read.format("delta").load(str(path)).select(*wanted.columns)

    def view(self, path: str) -> DataFrame:
        return self.spark.read.format("delta").load(path)
