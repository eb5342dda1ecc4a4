"""`lakesync snapshot`: the latest consistent point of every projection (the mirrors, the
ledger, the changelog, the views and event time), and DataFrames pinned to it.

Every table of a point is read as of its Delta version (sync/delta/points.py), so all of
them are seen together at one source transaction: an account never ahead of its
customer, both sides of a transfer or neither, an account's mirrored balance equal to its
ledger balance, an order's document and its customer's summary as the mirrors hold them.
Any Delta reader can do the same with the versions `lakesync snapshot --json` prints;
from Python:

    from sync.commands.snapshot import dataframes
    tables = dataframes(spark, config.load())     # {"mirror.accounts": DataFrame, ...}

Readers that want each table's latest version read the tables as usual.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from projections import changelog, mirrors
from projections.event_time import tables as event_time
from projections.ledger import projection as ledger
from projections.views import projection as views
from sync.commands import READS
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.points import Point
from sync.errors import LakesyncError


class NoPoint(LakesyncError):
    exit_code = 1


# The projections that apply whole source transactions and publish their points, in the
# order a point lists their tables (its batch is the first one's).
PUBLISHERS = (mirrors.NAME, ledger.NAME, changelog.NAME)
# The projections fed by their tables, whose points name the versions they read (derived).
DERIVED = (views.NAME, event_time.NAME)
# The order in which they cut their batches at common places (`Settings.aligned`): each
# follows those before it. The changelog, which feeds the views and is measured for
# freshness, leads; the mirrors follow its frequent stops, so what they hold is short;
# the ledger, light, follows both and waits for the mirrors' stops.
FOLLOW_ORDER = (changelog.NAME, mirrors.NAME, ledger.NAME)


def published(settings: Settings, of: tuple[str, ...] = ()) -> list[Point]:
    """Every consistent point, oldest first, of the projections `of` names (all by
    default) and of those they read (the views' point holds the mirrors', the ledger's
    and the changelog's tables): a point of fewer projections is fresher."""
    chosen = set(of or PUBLISHERS + DERIVED)
    chosen |= {read for name in chosen for read in READS.get(name, ())}

    def kept(names):  # (of the projections that run: one turned off keeps its old points)
        return {name: points.published(catalog.root(settings, name), name) for name in names
                if name in chosen and name in settings.projections}
    return points.consistent(kept(PUBLISHERS), kept(DERIVED))


def latest(settings: Settings, of: tuple[str, ...] = ()) -> Point:
    if not settings.whole_transactions:
        raise NoPoint("no consistent point: the projections apply each change as read "
                      "(LAKESYNC_WHOLE_TRANSACTIONS=off)")
    unknown = [name for name in of if name not in PUBLISHERS + DERIVED]
    if unknown:
        raise LakesyncError(f"--of: no projection named {', '.join(unknown)}; "
                            f"one of: {', '.join(PUBLISHERS + DERIVED)}")
    found = published(settings, of)
    if not found:
        raise NoPoint("no consistent point yet: the mirrors have applied no batch since their source "
                      "transactions began to arrive (`lakesync run`)")
    return found[-1]


def dataframes(spark: SparkSession, settings: Settings, point: Point | None = None) -> dict[str, DataFrame]:
    """Every table of `point` (the latest if None), each read as of its version."""
    point = point or latest(settings)
    return {name: spark.read.format("delta").option("versionAsOf", table["version"]).load(table["path"])
            for name, table in point.tables.items()}


def render(point: Point) -> str:
    lines = [f"consistent point at source commit LSN {point.lsn}, committed {point.committed_at} "
             f"(mirrors' batch {point.batch}); published {point.published_at}",
             f"{'table':<36} {'version':>8}  path"]
    lines += [f"{name:<36} {table['version']:>8}  {table['path']}" for name, table in sorted(point.tables.items())]
    return "\n".join(lines)
