"""`lakesync verify`: compare every projection with its Postgres oracle.

For each target: run its oracle SQL on Postgres and read its Delta table, and compare
the two (sync/compare.py); a target without oracle SQL is checked by its projection.
The tables are read with DuckDB (sync/delta/reader.py), not Spark: a reader apart from
the engine that wrote them, and no JVM to start; a Spark session is started only for
the projections' own checks (the changelog, the ledger, the enriched ledger, event
time), and only when one of them is verified.
"""

from __future__ import annotations

from psycopg.types.string import TextLoader

from sync.commands import all_projections
from sync.compare import Report, compare, oracle_columns
from sync.config import Settings
from sync.delta import reader
from sync.delta.merge import table_exists
from sync.stack.postgres import pg_connect
from sync.streaming import spark as spark_session


def verify(settings: Settings, spark=None, only: set[str] | None = None) -> list[Report]:
    """Compare every target (or those named in `only`) with its oracle. A Spark session
    is started for a projection's own check unless one is given (tests share theirs)."""
    reports = []
    duck = reader.connect()
    with pg_connect(settings) as conn:
        # JSON as its text: psycopg would turn both SQL NULL and JSON null into None.
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("jsonb", TextLoader)
        for projection in all_projections(settings):
            for target in projection.verify_targets(settings, conn):
                if only is not None and target.name not in only:
                    continue
                if not target.oracle_sql:  # no SQL gives this target: its projection checks it
                    if spark is None:
                        spark = spark_session.session(settings, "lakesync-verify")
                    reports.append(projection.check(settings, spark, conn, target))
                    conn.commit()
                    continue
                columns, types = oracle_columns(conn, target.oracle_sql)
                source_rows = conn.cursor(name=f"verify_{len(reports)}").execute(target.oracle_sql)
                target_rows = (reader.rows(duck, target.table, columns, target.target_filter)
                               if table_exists(target.table) else [])
                reports.append(compare(target, source_rows, target_rows, columns, types, target.keys))
                conn.commit()
    duck.close()
    return reports
