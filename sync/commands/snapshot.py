"""`lakesync snapshot`: the mirrors' latest consistent point, and DataFrames pinned to it.

Every table of a point is read as of its Delta version (sync/delta/points.py), so the
mirrors are seen together at one source transaction: an account never ahead of its
customer, both sides of a transfer or neither. Any Delta reader can do the same with
the versions `lakesync snapshot --json` prints; from Python:

    from sync.commands.snapshot import dataframes
    tables = dataframes(spark, config.load())     # {"mirror.accounts": DataFrame, ...}

Readers that want each table's latest version read the tables as usual.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from projections import mirrors
from sync.config import Settings
from sync.delta import catalog, points
from sync.delta.points import Point
from sync.errors import LakesyncError


class NoPoint(LakesyncError):
    exit_code = 1


def latest(settings: Settings) -> Point:
    if not settings.whole_transactions:
        raise NoPoint("no consistent point: the mirrors apply each change as read (LAKESYNC_WHOLE_TRANSACTIONS=off)")
    found = points.latest(catalog.root(settings, mirrors.NAME), mirrors.NAME)
    if found is None:
        raise NoPoint("no consistent point yet: the mirrors have applied no batch (`lakesync run`)")
    return found


def dataframes(spark: SparkSession, settings: Settings, point: Point | None = None) -> dict[str, DataFrame]:
    """Every table of `point` (the latest if None), each read as of its version."""
    point = point or latest(settings)
    return {name: spark.read.format("delta").option("versionAsOf", table["version"]).load(table["path"])
            for name, table in point.tables.items()}


def render(point: Point) -> str:
    through = (f"source commit LSN {point.lsn}, committed {point.committed_at}" if point.lsn is not None
               else "snapshot reads only")
    lines = [f"consistent point of batch {point.batch}: {through}; published {point.published_at}",
             f"{'table':<36} {'version':>8}  path"]
    lines += [f"{name:<36} {table['version']:>8}  {table['path']}" for name, table in sorted(point.tables.items())]
    return "\n".join(lines)
