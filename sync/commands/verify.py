"""`lakesync verify`: compare every projection with its Postgres oracle.

For each target: run its oracle SQL on Postgres and read its Delta table, and compare
the two (sync/compare.py); a target without oracle SQL is checked by its projection.
"""

from __future__ import annotations

from typing import Iterable

from delta.tables import DeltaTable
from psycopg.types.string import TextLoader
from pyspark.sql import functions as F

from sync.cdc.types import quoted
from sync.commands import all_projections
from sync.compare import Report, compare, oracle_columns
from sync.config import Settings
from sync.stack.postgres import pg_connect
from sync.streaming import spark as spark_session


def verify(settings: Settings, spark=None, only: set[str] | None = None) -> list[Report]:
    """Compare every target (or those named in `only`) with its oracle. A Spark session
    is started unless one is given (tests share theirs)."""
    reports = []
    with pg_connect(settings) as conn:
        # JSON as its text: psycopg would turn both SQL NULL and JSON null into None.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("jsonb", TextLoader)
        for projection in all_projections(settings):
            for target in projection.verify_targets(settings, conn):
                if only is not None and target.name not in only:
                    continue
                if spark is None:
                    spark = spark_session.session(settings, "lakesync-verify")
                if not target.oracle_sql:  # no SQL gives this target: its projection checks it
                    reports.append(projection.check(settings, spark, conn, target))
                    conn.commit()
                    continue
                columns, types = oracle_columns(conn, target.oracle_sql)
                source_rows = conn.cursor(name=f"verify_{len(reports)}").execute(target.oracle_sql)
                target_rows = _delta_rows(spark, target.table, columns, target.target_filter)
                reports.append(compare(target, source_rows, target_rows, columns, types, target.keys))
                conn.commit()
    return reports


def _delta_rows(spark, path: str, columns: list[str], where: str = "") -> Iterable[tuple]:
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    frame = spark.read.format("delta").load(path)
    if where:
        frame = frame.where(where)
    present = set(frame.columns)
    selected = frame.select(*[F.col(quoted(c)) if c in present else F.lit(None).alias(c) for c in columns])
    return (tuple(row) for row in selected.toLocalIterator())
