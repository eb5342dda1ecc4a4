"""The embedded stack: Postgres, Kafka (KRaft), Kafka Connect + Debezium, an OpenSearch
node (unless LAKESYNC_SEARCH_URL=off) and, with LAKESYNC_SPARK_WORKERS, a Spark standalone
cluster, on 127.0.0.1.

`up` and `down` are idempotent: `up` starts only what is not running and re-registers
the connector; `down` stops the runner and every service and leaves no process behind.
The stack knows nothing of what runs on it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from sync.config import ADMIN_ROLE, ROLES, Settings, read_secrets
from sync.errors import StackError
from sync.stack import jvm, migrate
from sync.stack.background import reap_orphaned_jvm, stop_background
from sync.stack.connect import Connect
from sync.stack.kafka import Kafka
from sync.stack.opensearch import OpenSearch
from sync.stack.postgres import Postgres
from sync.stack.process import port_open
from sync.stack.spark_cluster import SparkCluster


def ensure_secrets(settings: Settings) -> None:
    """Generate role passwords once; write them where libpq and Connect read them."""
    settings.home.mkdir(parents=True, exist_ok=True)
    known = read_secrets(settings)
    wanted = ["admin_password"] + [f"{kind}_password" for kind in ROLES]
    if any(key not in known for key in wanted):
        known = {key: known.get(key) or secrets.token_urlsafe(18) for key in wanted}
        settings.secrets_file.write_text("".join(f"{k}={v}\n" for k, v in known.items()))
        os.chmod(settings.secrets_file, 0o600)
    lines = [f"{settings.pg_host}:{settings.pg_port}:*:{ADMIN_ROLE}:{known['admin_password']}"]
    lines += [f"{settings.pg_host}:{settings.pg_port}:*:{role}:{known[f'{kind}_password']}"
              for kind, role in ROLES.items()]
    settings.pgpass_file.write_text("\n".join(lines) + "\n")
    os.chmod(settings.pgpass_file, 0o600)


def up(settings: Settings, say: Callable[[str], None] = print) -> float:
    """Start what is not running; returns the seconds it took.

    Two lines of starts at once: Postgres, the migrations, Kafka and Connect in turn
    (each needs the one before it), and beside them the services that need none of the
    others, OpenSearch and the Spark cluster, whose JVMs start while Connect's does. Each
    says when it is ready; a failure of either line is raised once both have ended."""
    started = time.monotonic()
    ensure_secrets(settings)
    chain = [
        ("postgres", Postgres(settings).start),
        ("migrations", lambda: migrate.upgrade(settings)),
        ("kafka", Kafka(settings).start),
        ("connect + debezium", Connect(settings).start),
    ]
    beside = []
    if settings.search_url:
        beside.append(("opensearch", OpenSearch(settings.home, settings.jars, settings.search_port).start))
    if settings.spark_workers:
        beside.append((f"spark ({settings.spark_workers} workers)", SparkCluster(settings).start))

    # One line at a time: print writes a line and its newline apart, so two threads'
    # lines could interleave (a line holding two, then an empty one).
    saying = threading.Lock()

    def run(steps: list[tuple[str, Callable[[], object]]]) -> None:
        for name, start in steps:
            t0 = time.monotonic()
            start()
            with saying:
                say(f"  {name:<20} ready ({time.monotonic() - t0:.1f}s)")

    with ThreadPoolExecutor(max_workers=1) as pool:
        side = pool.submit(run, beside)
        run(chain)  # (a failure here too leaves the block only once the other line has ended)
    side.result()
    return time.monotonic() - started


def connect_external(settings: Settings, say: Callable[[str], None] = print) -> None:
    """For services the team runs itself: role passwords, migrations, the connector."""
    ensure_secrets(settings)
    for name, step in (("migrations", lambda: migrate.upgrade(settings)),
                       ("connector", Connect(settings).register)):
        step()
        say(f"  {name:<20} done")


def down(settings: Settings, say: Callable[[str], None] = print) -> None:
    if stop_background(settings, timeout=60):
        say("  runner               stopped")
    settings.runner_pidfile.unlink(missing_ok=True)
    reap_orphaned_jvm(settings)
    for name, service in (("spark", SparkCluster(settings)), ("connect", Connect(settings)),
                          ("kafka", Kafka(settings)), ("postgres", Postgres(settings)),
                          ("opensearch", OpenSearch(settings.home, settings.jars, settings.search_port))):
        service.stop()
        say(f"  {name:<20} stopped")


# A broker's port, its controller's after it and a Connect worker's after that: below the
# ephemeral range, apart from the stacks' own (sync/config.py, tests/conftest.py, Makefile).
ARCHIVE_PORTS = range(24092, 24992, 3)


def archive_classes(settings: Settings) -> list[Path]:
    """Write the Kafka broker's and the Connect worker's class archives (`make jars`,
    jvm.class_archive): both started on free ports in a folder of their own and stopped
    once ready; each JVM records every class it loaded as it exits."""
    archives = [jvm.class_archive(settings.jars, service) for service in (Kafka.name, Connect.name)]
    for archive in archives:
        archive.unlink(missing_ok=True)
    port = next((p for p in ARCHIVE_PORTS if not any(port_open("127.0.0.1", p + n) for n in range(3))), None)
    if port is None:
        raise StackError(f"no three free ports in {ARCHIVE_PORTS} to start Kafka and Connect on for their "
                         "class archives")
    work = Path(tempfile.mkdtemp(prefix="lakesync-classes-"))
    apart = dataclasses.replace(settings, home=work, kafka_bootstrap=f"127.0.0.1:{port}",
                                connect_url=f"http://127.0.0.1:{port + 2}")
    broker, worker = Kafka(apart), Connect(apart)
    try:
        broker.start(f"-XX:ArchiveClassesAtExit={archives[0]}", *jvm.QUIET_CDS.split())
        worker.start_worker(f"-XX:ArchiveClassesAtExit={archives[1]}", *jvm.QUIET_CDS.split())
    finally:  # SIGTERM: each JVM writes its archive as it exits, and stop waits for that
        worker.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return archives
