"""`lakesync verify`: compare every projection with its Postgres oracle.

For each target: run its oracle SQL on Postgres and read its Delta table, and compare
the two (sync/compare.py); a target without oracle SQL is checked by its projection.
The tables are read with DuckDB (sync/delta/reader.py), not Spark: a reader apart from
the engine that wrote them, and no JVM to start. The projections' own checks read
with DuckDB too (the changelog), with delta-rs (the ledger), or with Spark where they
recompute a projection as Spark computes it (the enriched ledger, event time): a
Spark session is started only when one of those is verified, in a side thread as
verify begins, so the other targets are compared while its JVM starts.
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
    readers = reader.Readers(lambda: spark_session.session(settings, "lakesync-verify"), spark)
    try:
        with pg_connect(settings) as conn:
            # JSON as its text: psycopg would turn both SQL NULL and JSON null into None.
            conn.adapters.register_loader("json", TextLoader)
            conn.adapters.register_loader("jsonb", TextLoader)
            compared = [(projection, target) for projection in all_projections(settings)
                        for target in projection.verify_targets(settings, conn)
                        if only is None or target.name in only]
            conn.commit()
            if any(not target.oracle_sql and projection.checks_with_spark(target) for projection, target in compared):
                readers.start_spark()
            for projection, target in compared:
                if not target.oracle_sql:  # no SQL gives this target: its projection checks it
                    reports.append(projection.check(settings, readers, conn, target))
                else:
                    columns, types = oracle_columns(conn, target.oracle_sql)
                    source_rows = conn.cursor(name=f"verify_{len(reports)}").execute(target.oracle_sql)
                    target_rows = (reader.rows(readers.duck, target.table, columns, target.target_filter)
                                   if table_exists(target.table) else [])
                    reports.append(compare(target, source_rows, target_rows, columns, types, target.keys))
                conn.commit()
    finally:
        readers.close()  # (after a session being started: until then, this process' output is its log)
    return reports
