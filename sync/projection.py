"""The projection contract: what every projection is, as a type.

A projection reads one source (Kafka topics by pattern, or other projections' Delta
tables), keeps one or more Delta tables (its targets) with one streaming query and one
checkpoint, and can prove its targets right (each target's oracle SQL on Postgres, or
the projection's own `check`). The commands (runner, status, wait, verify, rebuild,
resnapshot) drive every projection through this type alone; the per-batch work lives
in `sync.streaming.batch.Batch`.

This module sits at the bottom of the layers with sync/config.py and sync/lake.py: it
imports nothing else of the project at run time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sync import lake
from sync.config import Settings
from sync.lake import LakePath

if TYPE_CHECKING:  # annotations only
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from sync.compare import Report
    from sync.delta.fencing import Fence
    from sync.delta.reader import Readers


@dataclass(frozen=True)
class Target:
    """One table a projection keeps, and the Postgres query it must equal."""

    name: str                 # e.g. mirror.customers (what `rebuild NAME` takes)
    kind: str                 # mirror, history, ledger, view, ...
    table: str                # where the Delta table lives (any Delta reader can open it)
    keys: list[str] = field(default_factory=list)
    oracle_sql: str = ""      # computes the same rows on Postgres; empty: the projection's `check`
    source: str = ""          # the source table or topic it follows
    target_filter: str = ""   # the Delta rows the oracle covers (e.g. current versions only)
    delta: bool = True        # False: `table` is not a Delta table (a search index's address)

    @property
    def state_key(self) -> str:
        return state_key(self.name)


def state_key(target_name: str) -> str:
    """What a projection's progress records a target's figures under, and `status` reads
    them by: the name after its first dot (mirror.orders: orders)."""
    return target_name.split(".", 1)[-1]


@dataclass(frozen=True)
class KafkaTopics:
    """Every topic whose name matches `pattern` (a Java regex), new topics included."""

    pattern: str
    headers: bool = False     # read the records' headers too
    unit = "records"          # what lag counts


@dataclass(frozen=True)
class DeltaTables:
    """Other projections' append-only Delta tables, read as streams in this order."""

    paths: tuple[str, ...]
    unit = "table_versions"

    def exist(self) -> bool:
        """A Delta stream needs its table: such a query starts once all exist."""
        return all((lake.at(path) / "_delta_log").is_dir() for path in self.paths)


Source = KafkaTopics | DeltaTables


class Projection(ABC):
    """One streaming query and the tables it keeps.

    Subclasses set `name` (its checkpoint, catalog entry, progress file and txnAppIds
    are named after it) and `kind`, and implement `source`, `targets` and `start`.
    """

    name: str
    kind: str

    @abstractmethod
    def source(self, settings: Settings) -> Source:
        """What the query reads."""

    @abstractmethod
    def targets(self, settings: Settings) -> list[Target]:
        """The tables it keeps now (`status` lists them, `rebuild --verify` compares them)."""

    @abstractmethod
    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        """Start the query: availableNow when `once`, else a processing-time trigger."""

    def verify_targets(self, settings: Settings, conn) -> list[Target]:
        """What `verify` compares (with Postgres at hand: the mirrors list its tables)."""
        return self.targets(settings)

    def check(self, settings: Settings, readers: Readers, conn, target: Target) -> Report:
        """`verify`'s comparison for a target without oracle SQL."""
        raise NotImplementedError(f"{self.name} has no check for {target.name}")

    def checks_with_spark(self, target: Target) -> bool:
        """Whether `check` of `target` reads with Spark (verify starts the session ahead)."""
        return True

    def ready(self, settings: Settings) -> bool:
        """Whether the query can start: a Delta-fed one waits for its input tables."""
        source = self.source(settings)
        return not isinstance(source, DeltaTables) or source.exist()

    def lag_of(self, target: Target, lag_by_input: dict[str, int]) -> int:
        """A target's share of the projection's lag (per input topic or table)."""
        return sum(lag_by_input.values())

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """What the projection keeps besides its targets and checkpoint (a swap or a
        resnapshot removes it with them)."""
        return []

    def reset(self, settings: Settings) -> None:
        """What a resnapshot drops besides the projection's tables, checkpoint, progress
        and state paths (sync/delta/catalog.py `clear`): e.g. a search index."""

    def __repr__(self) -> str:
        return f"<projection {self.name}>"
