"""Delta tables read without Spark: DuckDB's delta extension (delta-kernel, no JVM).

`verify` reads each target through it: a reader independent of the engine that wrote
the table (a misread Spark shares with its own writes would not show against itself),
and one that starts in milliseconds where a Spark session takes seconds and a JVM's
warm-up (docs/benchmark.md). It reads what Spark writes here: deletion vectors, column
mapping, widened types (tests/e2e/test_readers.py reads every kind of table both ways).
The extensions come from their pinned pip packages, never downloaded at LOAD: delta,
and httpfs for a lake in a bucket (its S3 secret from sync/lake.py's store, made when
the first table there is read).
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import duckdb
import duckdb_extension_delta
import duckdb_extension_httpfs

from sync import lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _extension(package, name: str) -> Path:
    return Path(package.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"


def connect() -> duckdb.DuckDBPyConnection:
    """DuckDB with the delta extension loaded, and no extension fetched on its own."""
    connection = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    connection.execute(f"LOAD '{_extension(duckdb_extension_delta, 'delta')}'")
    connection.execute("SET TimeZone = 'UTC'")
    return connection


class Readers:
    """What verify's checks read the lake with: this DuckDB connection, and a Spark session
    for the checks that recompute a projection the way Spark computes it. The session is
    the one given, or started by `start_spark` in a side thread (its JVM takes seconds
    to start: verify compares other targets meanwhile), or on first use."""

    def __init__(self, start: Callable[[], SparkSession], spark: SparkSession | None = None):
        self.duck = connect()
        self._start = start
        self._starter: ThreadPoolExecutor | None = None
        self._spark: Future | None = None
        self._shared: dict[str, Any] = {}
        if spark is not None:
            self._spark = Future()
            self._spark.set_result(spark)

    def start_spark(self) -> None:
        """Start the Spark session in a side thread, unless one is started or given."""
        if self._spark is None:
            self._starter = ThreadPoolExecutor(1, thread_name_prefix="spark-start")
            self._spark = self._starter.submit(self._start)

    @property
    def spark(self) -> SparkSession:
        self.start_spark()
        return self._spark.result()

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """What several checks of one verify read alike, made by the first that asks for
        `name` (event time's recomputation, which each of its tables' checks reads)."""
        if name not in self._shared:
            self._shared[name] = make()
        return self._shared[name]

    def close(self) -> None:
        """Close DuckDB, once the Spark session is started if it is being started (it
        stays open for what comes after verify)."""
        self.duck.close()
        if self._starter is not None:
            self._starter.shutdown()


def scan(connection: duckdb.DuckDBPyConnection, path: str) -> str:
    """What delta_scan takes for the table at `path` (s3:// for a bucket's: the first such
    table read on this connection loads httpfs and the store's secret)."""
    if not lake.on_object_storage(path):
        return path
    if not connection.execute("SELECT 1 FROM duckdb_secrets() WHERE name = 'lake'").fetchall():
        connection.execute(f"LOAD '{_extension(duckdb_extension_httpfs, 'httpfs')}'")
        store, found = lake.store(), lake.credentials()
        options: dict[str, str | bool] = {"REGION": store.region}
        if found:
            options.update(KEY_ID=found["access_key"], SECRET=found["secret_key"])
            if "session_token" in found:
                options["SESSION_TOKEN"] = found["session_token"]
        if store.endpoint:
            scheme, _, address = store.endpoint.partition("://")
            options.update(ENDPOINT=address, URL_STYLE="path", USE_SSL=scheme == "https")
        listed = ", ".join(f"{key} {str(value).lower() if isinstance(value, bool) else _literal(value)}"
                           for key, value in options.items())
        connection.execute(f"CREATE SECRET lake (TYPE s3, {listed})")
    return lake.reader_uri(path)


def _literal(value: str) -> str:
    """A DuckDB string literal (standard SQL: a quote doubled)."""
    return "'" + value.replace("'", "''") + "'"


def utc_naive(value: Any) -> Any:
    """A timestamp with its zone as its UTC time without one, as Spark gives a Delta
    timestamp in a UTC session; nested values likewise."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, list):
        return [utc_naive(v) for v in value]
    if isinstance(value, dict):
        return {k: utc_naive(v) for k, v in value.items()}
    return value


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def rows(connection: duckdb.DuckDBPyConnection, path: str, columns: list[str], where: str = "",
         batch_rows: int = 10_000) -> Iterator[tuple]:
    """The table's current rows, `columns` in order (a column the table lacks: null);
    `where` a filter in SQL both Spark and DuckDB read alike (`NOT deleted`). Through
    Arrow, whose timestamps with a zone need no time-zone package."""
    path = scan(connection, path)
    present = {name for (name, *_) in connection.execute("DESCRIBE SELECT * FROM delta_scan(?)", [path]).fetchall()}
    names = [f"c{n}" for n in range(len(columns))]  # (a column may be named like no SQL alias can be)
    selected = ", ".join(f"{quoted(c) if c in present else 'NULL'} AS {a}" for c, a in zip(columns, names))
    query = f"SELECT {selected} FROM delta_scan(?)" + (f" WHERE {where}" if where else "")
    for batch in connection.execute(query, [path]).to_arrow_reader(batch_rows):
        for row in batch.to_pylist():
            yield tuple(utc_naive(row[a]) for a in names)
