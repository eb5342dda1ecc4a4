"""All of Lakesync's configuration, read in one place.

Addresses come from environment variables whose defaults point at the embedded stack
(`lakesync up`); pointed at a team's own Postgres, Kafka, Connect and Spark, the same
code runs unchanged. The embedded stack listens where these addresses say, so changing
a port is one variable.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from sync import lake
from sync.errors import LakesyncError
from sync.lake import LakePath

ROOT = Path(__file__).resolve().parent.parent

# Names shared by the connector config, the migrations and the projections.
TOPIC_PREFIX = "lakesync"            # Debezium topic.prefix: topics are PREFIX.SCHEMA.TABLE
DEFAULT_SCHEMA = "public"            # its tables' mirrors are named by the table alone (mirror.orders)
CONTROL_SCHEMA = "lakesync"          # heartbeat table, also captured (never mirrored)
PROJECTIONS = ("mirrors", "changelog", "ledger", "views", "event_time")  # all of them, the runner's order
EVENTS_TOPIC_PREFIX = f"{TOPIC_PREFIX}.events."  # the outbox router's topics (sync/outbox.py), then the type
HEARTBEAT_TABLE = f"{CONTROL_SCHEMA}.heartbeat"
# The connector's heartbeat (every 5 s) touches its row only when the slot holds this much
# WAL unconfirmed (writes it does not capture) or the row's last beat is this old: each touch
# is a source transaction, a batch for the changelog, the mirrors and the ledger alike.
HEARTBEAT_WAL_BYTES = 1 << 20
HEARTBEAT_MAX_AGE_SECONDS = 60
TABLE_DROPS_TABLE = f"{CONTROL_SCHEMA}.table_drops"  # captured: a DROP TABLE, at its place in the WAL
SIGNAL_TABLE = f"{CONTROL_SCHEMA}.debezium_signal"  # captured: Debezium's signals (incremental snapshots)
COLUMN_CHANGES_TABLE = f"{CONTROL_SCHEMA}.column_changes"  # captured: a RENAME or DROP COLUMN, at its place
COLUMN_NAMES_TABLE = f"{CONTROL_SCHEMA}.column_names"  # what column_changes is told from (not captured)
# Kafka compacts no record of a table topic younger than this (connectors/): until then a
# topic holds every change, so fewer changes of a source transaction than its END counts
# means some are still to come, never that compaction removed them (sync/cdc/transactions.py).
COMPACTION_LAG_MS = 86_400_000
CONNECTOR_NAME = "lakesync-postgres"
PUBLICATION = "lakesync_pub"
SLOT = "lakesync_slot"
ROLES = {  # role -> what it may do; created by migrations/versions/0001
    "app": "lakesync_app",            # the application: DML on the demo schema
    "capture": "lakesync_capture",    # Debezium: REPLICATION + SELECT on captured tables
    "auditor": "lakesync_auditor",    # read-only
}
ADMIN_ROLE = "lakesync_admin"        # owner/superuser of the embedded database


@dataclass(frozen=True)
class CaptureSet:
    """The tables Lakesync captures, as the user names them in LAKESYNC_CAPTURE: entries
    separated by commas, each a schema (all its tables, those created later too) or
    `schema.PATTERN` (the tables of that schema whose whole name matches the regular
    expression PATTERN, as Debezium's table.include.list matches them). `lakesync up`
    renders it into the publication (the entries' schemas), the grants and the
    connector's include list; the mirrors follow every topic the connector writes."""

    entries: tuple[tuple[str, str], ...]   # (schema, table pattern); ".*" for a whole schema

    @property
    def schemas(self) -> list[str]:
        return sorted({schema for schema, _ in self.entries})

    def include_list(self) -> list[str]:
        """Debezium's table.include.list entries (regular expressions over schema.table)."""
        return [f"{re.escape(schema)}\\.{pattern}" for schema, pattern in self.entries]

    def captures(self, schema: str, table: str) -> bool:
        return any(schema == s and re.fullmatch(p, table) for s, p in self.entries)

    def plus(self, other: "CaptureSet") -> "CaptureSet":
        return CaptureSet(tuple(dict.fromkeys(self.entries + other.entries)))

    def texts(self) -> list[str]:
        """Each entry as the user writes it."""
        return [schema if pattern == ".*" else f"{schema}.{pattern}" for schema, pattern in self.entries]

    def __str__(self) -> str:
        return ",".join(self.texts())


def parse_capture(text: str) -> CaptureSet:
    """LAKESYNC_CAPTURE -> CaptureSet; a one-line LakesyncError for what cannot be captured."""
    entries = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        schema, _, pattern = entry.partition(".")
        if not schema:
            raise LakesyncError(f"LAKESYNC_CAPTURE: {entry!r} names no schema (write schema or schema.TABLE_PATTERN)")
        if schema in (CONTROL_SCHEMA, EVENTS_TOPIC_PREFIX.split(".")[1]):
            # Their topics would be Lakesync's own: the heartbeat's, or the outbox events'.
            raise LakesyncError(f"LAKESYNC_CAPTURE: schema {schema!r} cannot be captured: "
                                f"topics {TOPIC_PREFIX}.{schema}.* are Lakesync's own")
        try:
            re.compile(pattern or ".*")
        except re.error as error:
            raise LakesyncError(f"LAKESYNC_CAPTURE: {entry!r}: the table pattern is not a regular expression "
                                f"({error})") from None
        entries.append((schema, pattern or ".*"))
    if not entries:
        raise LakesyncError("LAKESYNC_CAPTURE names no table: give schemas or schema.TABLE_PATTERN entries")
    return CaptureSet(tuple(dict.fromkeys(entries)))


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _whole(name: str, default: str, of: str = "") -> int:
    value = _env(name, default)
    if not value.isdigit():
        raise LakesyncError(f"{name} must be a whole number{of} (0 or more), not {value!r}")
    return int(value)


def _seconds(name: str, default: str) -> int:
    return _whole(name, default, " of seconds")


def _lake(value: str) -> LakePath:
    """LAKESYNC_LAKE: a local directory (a path or a file: URI) or a bucket's prefix
    (s3a://BUCKET/PREFIX, sync/lake.py); any other URI is refused in one line."""
    try:
        return lake.at(value)
    except LakesyncError as error:
        raise LakesyncError(f"LAKESYNC_LAKE={error}") from None


def _port(url: str, default: int) -> int:
    return urlsplit(url if "//" in url else f"//{url}").port or default


@dataclass(frozen=True)
class Settings:
    home: Path
    lake: LakePath
    jars: Path
    pg_dsn: str
    kafka_bootstrap: str
    connect_url: str
    spark_master: str
    fault: str
    trigger_seconds: float
    shuffle_partitions: int
    # Tables of one batch applied at once (each on a Spark session of its own): a small
    # table's commit is mostly waiting, so several overlap on two cores.
    apply_threads: int
    max_offsets_per_trigger: int
    tombstone_hours: float
    # Partitions of each table and outbox event topic Connect creates (a topic made before
    # keeps its own count). The transaction topic and the drops' and column changes'
    # topics keep one: their order is commit order.
    topic_partitions: int
    # Where the Connect worker reaches Postgres and the secrets file: the same as ours on
    # the embedded stack, but another host/path when Connect runs in a container.
    connect_pg_address: str
    connect_secrets_path: str
    # The search index order documents are pushed to (OpenSearch/Elasticsearch `_bulk`);
    # empty when LAKESYNC_SEARCH_URL=off.
    search_url: str = ""
    # Where the runner serves Prometheus metrics (127.0.0.1); 0 when LAKESYNC_METRICS_PORT=off.
    metrics_port: int = 0
    # Event time (projections/event_time/): the watermark trails the greatest event time
    # seen by this much, and a window still takes corrections until the watermark is this
    # far past its end. Changing either needs `lakesync rebuild event_time`.
    watermark_delay_seconds: int = 600
    allowed_lateness_seconds: int = 3600
    # spark.driver.memory: with a local master the driver runs every task, so Spark's whole heap.
    spark_driver_memory: str = "3g"
    # A Spark standalone cluster `up` starts on 127.0.0.1 (sync/stack/spark_cluster.py):
    # this many workers of these cores and this much memory each, the master on this port
    # (its web UI on the next). 0: none, and Spark runs in the driver (local[*]).
    spark_workers: int = 0
    spark_worker_cores: int = 1
    spark_worker_memory: str = "2g"
    spark_master_port: int = 17077
    # The JVM's own log lines (Spark's WARNs, the JVM's warnings) on the terminal of the
    # commands that start Spark (LAKESYNC_VERBOSE=1, `lakesync --verbose`); else in a log
    # file under `logs` (sync/streaming/spark.py).
    verbose: bool = False
    # The mirrors, the changelog and the ledger apply whole source transactions only, in
    # commit order, and publish consistent points
    # (sync/cdc/transactions.py, sync/delta/points.py); off
    # (LAKESYNC_WHOLE_TRANSACTIONS=off): every change as soon as it is read.
    whole_transactions: bool = True
    # `lakesync run --once`: the offset after the last record of the transaction topic when
    # the run began. Every projection applies the source transactions before it and holds
    # the later ones, so all of them end at the same transaction (a consistent point).
    # None for every other command.
    transactions_until: int | None = None
    # `lakesync run` (not --once): the projections it runs that publish consistent points,
    # in the order each follows those before it (its batches stop where they stand:
    # sync/delta/points.py `follow`). Empty for every other command.
    aligned: tuple[str, ...] = ()
    # (projection, directory) pairs overriding the catalog (sync/delta/catalog.py): a rebuild
    # writes the projection it builds there. Empty for every other command.
    roots: tuple[tuple[str, str], ...] = ()
    # What is captured: LAKESYNC_CAPTURE (default: every table of the public schema), and
    # the entries `lakesync capture add` added since (`capture_added`, kept in capture_file).
    capture: CaptureSet = CaptureSet(((DEFAULT_SCHEMA, ".*"),))
    capture_added: tuple[str, ...] = ()
    # The application's outbox (LAKESYNC_OUTBOX, schema.table): the router turns its rows into events.
    outbox_table: str = f"{DEFAULT_SCHEMA}.outbox"
    # The projections that run (LAKESYNC_PROJECTIONS; sync/commands checks the names). The
    # ledger, the views and event time are the demo's (its tables and outbox events); on a
    # team's own database, mirrors and changelog.
    projections: tuple[str, ...] = PROJECTIONS
    secrets_file: Path = field(init=False)
    pgpass_file: Path = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "secrets_file", self.home / "secrets.properties")
        object.__setattr__(self, "pgpass_file", self.home / "pgpass")

    # -- where the embedded services listen (derived from the addresses above) --
    @property
    def pg_port(self) -> int:
        return _port(self.pg_dsn, 5432)

    @property
    def pg_database(self) -> str:
        return urlsplit(self.pg_dsn).path.lstrip("/") or "postgres"

    @property
    def pg_host(self) -> str:
        return urlsplit(self.pg_dsn).hostname or "127.0.0.1"

    @property
    def kafka_port(self) -> int:
        return _port(self.kafka_bootstrap.split(",")[0], 9092)

    @property
    def kafka_controller_port(self) -> int:
        return self.kafka_port + 1

    @property
    def connect_port(self) -> int:
        return _port(self.connect_url, 8083)

    @property
    def search_port(self) -> int:
        return _port(self.search_url, 9200)

    @property
    def connect_pg_host(self) -> str:
        return self.connect_pg_address.split(":")[0] if self.connect_pg_address else self.pg_host

    @property
    def connect_pg_port(self) -> int:
        return int(self.connect_pg_address.split(":")[1]) if ":" in self.connect_pg_address else self.pg_port

    @property
    def connect_secrets_file(self) -> str:
        return self.connect_secrets_path or str(self.secrets_file)

    # -- where the runner keeps its state (a projection's checkpoint: sync/delta/catalog.py) --
    @property
    def runner_pidfile(self) -> Path:
        return self.home / "runner.pid"

    @property
    def runner_swapfile(self) -> Path:
        """`rebuild --swap`'s request to the running runner (sync/commands/runner.py `hand_over_swap`)."""
        return self.home / "runner-swap.json"

    @property
    def runner_swappedfile(self) -> Path:
        """The runner's answer to that request: what it did, or why it could not."""
        return self.home / "runner-swapped.json"

    @property
    def runner_jvm_pidfile(self) -> Path:
        """The runner's Spark JVM, which outlives a SIGKILLed runner for a moment."""
        return self.home / "runner-jvm.pid"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def capture_file(self) -> Path:
        """What `lakesync capture` added to LAKESYNC_CAPTURE, and the snapshots it asked for."""
        return self.home / "capture.json"


def load() -> Settings:
    home = Path(_env("LAKESYNC_HOME", str(ROOT / ".stack"))).resolve()
    workers = _whole("LAKESYNC_SPARK_WORKERS", "0")
    master_port = _whole("LAKESYNC_SPARK_MASTER_PORT", "17077")
    settings = Settings(
        home=home,
        lake=_lake(_env("LAKESYNC_LAKE", str(home / "lake"))),
        jars=Path(_env("LAKESYNC_JARS", str(ROOT / "build" / "jvm"))).resolve(),
        pg_dsn=_env("LAKESYNC_PG_DSN", f"postgresql://{ADMIN_ROLE}@127.0.0.1:15432/lakesync"),
        kafka_bootstrap=_env("LAKESYNC_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
        connect_url=_env("LAKESYNC_CONNECT_URL", "http://127.0.0.1:18083").rstrip("/"),
        # local[*]: a task slot per core the JVM sees; with workers, the cluster `up` starts.
        spark_master=_env("LAKESYNC_SPARK_MASTER", f"spark://127.0.0.1:{master_port}" if workers else "local[*]"),
        fault=_env("LAKESYNC_FAULT", ""),
        trigger_seconds=float(_env("LAKESYNC_TRIGGER_SECONDS", "1")),
        shuffle_partitions=int(_env("LAKESYNC_SHUFFLE_PARTITIONS", "4")),
        apply_threads=max(1, int(_env("LAKESYNC_APPLY_THREADS", "4"))),
        max_offsets_per_trigger=int(_env("LAKESYNC_MAX_OFFSETS_PER_TRIGGER", "500000")),
        # Longer than Kafka's delete.retention.ms (1 day): by then no replay can bring a
        # deleted key's older records back, so its tombstone may go.
        tombstone_hours=float(_env("LAKESYNC_TOMBSTONE_HOURS", "168")),
        topic_partitions=_whole("LAKESYNC_TOPIC_PARTITIONS", "1"),
        connect_pg_address=_env("LAKESYNC_CONNECT_PG_ADDRESS", ""),
        connect_secrets_path=_env("LAKESYNC_CONNECT_SECRETS_FILE", ""),
        search_url="" if _env("LAKESYNC_SEARCH_URL", "") == "off"
        else _env("LAKESYNC_SEARCH_URL", "http://127.0.0.1:19200").rstrip("/"),
        metrics_port=0 if _env("LAKESYNC_METRICS_PORT", "") == "off" else int(_env("LAKESYNC_METRICS_PORT", "19400")),
        watermark_delay_seconds=_seconds("LAKESYNC_WATERMARK_DELAY_SECONDS", "600"),
        allowed_lateness_seconds=_seconds("LAKESYNC_ALLOWED_LATENESS_SECONDS", "3600"),
        spark_driver_memory=_env("LAKESYNC_SPARK_DRIVER_MEMORY", "3g"),
        spark_workers=workers,
        spark_worker_memory=_env("LAKESYNC_SPARK_WORKER_MEMORY", "2g"),
        spark_master_port=master_port,
        verbose=_env("LAKESYNC_VERBOSE", "") not in ("", "0", "false", "no"),
        whole_transactions=_env("LAKESYNC_WHOLE_TRANSACTIONS", "on") != "off",
        capture=parse_capture(_env("LAKESYNC_CAPTURE", DEFAULT_SCHEMA)),
        outbox_table=_env("LAKESYNC_OUTBOX", f"{DEFAULT_SCHEMA}.outbox"),
        projections=tuple(name.strip() for name in _env("LAKESYNC_PROJECTIONS", ",".join(PROJECTIONS)).split(",")
                          if name.strip()),
    )
    if settings.topic_partitions < 1:
        raise LakesyncError("LAKESYNC_TOPIC_PARTITIONS must be 1 or more")
    if settings.topic_partitions > 1 and not settings.whole_transactions:
        # Across partitions, only the transaction topic gives commit order (event time's
        # stamps, the consistent points depend on it).
        raise LakesyncError(f"LAKESYNC_TOPIC_PARTITIONS={settings.topic_partitions} needs whole source transactions: "
                            "unset LAKESYNC_WHOLE_TRANSACTIONS=off, or use one partition")
    added = _captured_since(settings.capture_file)
    if added:
        settings = replace(settings, capture=settings.capture.plus(parse_capture(",".join(added))),
                           capture_added=tuple(added))
    # Passwords never sit in a DSN: libpq reads them from this file (user-set wins).
    os.environ.setdefault("PGPASSFILE", str(settings.pgpass_file))
    return settings


def _captured_since(path: Path) -> list[str]:
    """The entries `lakesync capture add` kept in `path` (none when it is missing)."""
    try:
        return list(json.loads(path.read_text()).get("added", []))
    except FileNotFoundError:
        return []
    except (OSError, ValueError, AttributeError) as error:
        raise LakesyncError(f"{path} cannot be read ({error}): fix or remove it, then `lakesync capture list`") from None


def read_secrets(settings: Settings) -> dict[str, str]:
    """Role passwords of the embedded stack (Java properties format, shared with Connect)."""
    return parse_properties(settings.secrets_file.read_text()) if settings.secrets_file.exists() else {}


def parse_properties(text: str) -> dict[str, str]:
    """Java properties text (key=value lines; # comments) as a dict."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def role_dsn(settings: Settings, role: str) -> str:
    """The source DSN with another role (its password comes from PGPASSFILE)."""
    parts = urlsplit(settings.pg_dsn)
    host = parts.netloc.split("@", 1)[-1]
    return parts._replace(netloc=f"{role}@{host}").geturl()


def pg_quoted(name: str) -> str:
    """A name as a Postgres identifier: in double quotes, a double quote in it doubled."""
    return '"' + name.replace('"', '""') + '"'


def sqlalchemy_url(dsn: str) -> str:
    """A libpq DSN (postgresql://...) as a SQLAlchemy URL for psycopg 3."""
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def safe_dsn(dsn: str) -> str:
    """The DSN with any password removed, for status output and messages."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.split("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}@{netloc}" if user else netloc).geturl()
