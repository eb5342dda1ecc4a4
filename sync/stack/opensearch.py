"""One OpenSearch node on 127.0.0.1, for the search-index sink (sync/search.py) and its tests.

The distribution is OpenSearch's integ-test-zip (jvm/opensearch, unpacked by `make jars`
into build/jvm/opensearch/): the server and the transport-netty4 module, no plugins. So
no security plugin (plain HTTP, no TLS, no passwords) and none of the optional modules
(painless, reindex, analysis-common, mapper-extras: no `scaled_float`); keyword, text,
numeric, date and boolean fields are core and all the sink needs. It has no bundled JDK
and runs on the Java 17 the Kafka broker uses.

Layout under HOME/opensearch/: config/ (our opensearch.yml and jvm.options, read through
OPENSEARCH_PATH_CONF, so the distribution is never written to), data/, logs/, tmp/. Its
console output goes to HOME/logs/opensearch.log, its pid to HOME/run/opensearch.pid.

OpenSearch refuses to run as root. As root we run it through `runuser` as the same
unprivileged account Postgres uses; that account must be able to write HOME/opensearch
(checked, with a message) and to read the distribution. When the distribution sits where
it cannot (a repository under /root, mode 700), it is copied once into HOME/opensearch/dist
and handed to that account: ~60 MB, a second or two, and the node then never depends on
the repository's permissions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from sync.errors import StackError
from sync.stack import jvm
from sync.stack.process import as_user, read_pid, require_free, service_user, spawn, stop_pid, wait_until

DEFAULT_PORT = 19200
TRANSPORT_OFFSET = 100  # transport on PORT+100, as 9300 sits beside 9200
HEAP = "-Xms256m -Xmx512m"  # appended after jvm.options, so it wins over the shipped 1g
START_TIMEOUT = 180.0  # a cold JVM on two busy cores; a healthy start takes well under a minute


def distribution(jars: Path) -> Path:
    """The unpacked integ-test-zip; a clear message when `make jars` has not run."""
    folder = jars / "opensearch"
    if not (folder / "bin" / "opensearch").is_file():
        raise StackError(f"the OpenSearch distribution is missing in {folder}; run `make jars` (needs Maven)")
    return folder


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class OpenSearch:
    name = "opensearch"

    def __init__(self, home: Path, jars: Path, port: int = DEFAULT_PORT):
        self.home = home
        self.jars = jars
        self.port = port
        self.transport_port = port + TRANSPORT_OFFSET
        self.dir = home / self.name
        self.pidfile = home / "run" / f"{self.name}.pid"
        self.log = home / "logs" / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return read_pid(self.pidfile) is not None

    def healthy(self) -> bool:
        """The node answers and its cluster state is usable (yellow: replicas unassigned, fine)."""
        try:
            with urllib.request.urlopen(f"{self.url}/_cluster/health", timeout=2) as response:
                return json.loads(response.read()).get("status") in ("green", "yellow")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self) -> float:
        """Start the node unless ours already runs; returns the seconds until it was healthy.

        1. refuse a taken port (ours would fail to bind, after a slow JVM start)
        2. write config/ under HOME and hand the folder to the service account
        3. spawn bin/opensearch in its own session, as that account when we are root
        4. wait for cluster health; if the process dies or the wait times out, raise with
           the tail of its log, so the reason is in the message and not only on disk
        """
        started = time.monotonic()
        if self.running():  # ours, perhaps still starting: wait for it rather than start another
            wait_until(self.healthy, START_TIMEOUT, "OpenSearch", self.log)
            return time.monotonic() - started
        require_free("127.0.0.1", self.port, "OpenSearch")
        require_free("127.0.0.1", self.transport_port, "OpenSearch's transport")
        dist = distribution(self.jars)
        java_home = Path(jvm.java()).resolve().parent.parent
        user = service_user()
        self._prepare(dist, user)
        dist = self._readable_distribution(dist, user)
        env = {**os.environ,
               "OPENSEARCH_JAVA_HOME": str(java_home),
               "OPENSEARCH_PATH_CONF": str(self.dir / "config"),
               "OPENSEARCH_TMPDIR": str(self.dir / "tmp"),
               "OPENSEARCH_JAVA_OPTS": HEAP}
        # The launcher warns about and drops these; unset them so the log stays quiet.
        for name in ("JAVA_TOOL_OPTIONS", "JAVA_OPTS"):
            env.pop(name, None)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")  # this start's output only, so the tail below is about it
        spawn(as_user(user, [str(dist / "bin" / "opensearch")]), self.pidfile, self.log, env=env)

        def ready() -> bool:
            if not self.running():
                raise StackError(f"OpenSearch exited during start-up; last lines of {self.log}:\n{tail(self.log)}")
            return self.healthy()

        try:
            wait_until(ready, START_TIMEOUT, "OpenSearch", self.log)
        except StackError as error:
            if self.running():  # timed out: leave nothing half-started behind
                self.stop()
                raise StackError(f"{error}; last lines:\n{tail(self.log)}") from None
            raise
        return time.monotonic() - started

    def stop(self) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            stop_pid(pid)
        self.pidfile.unlink(missing_ok=True)

    def settings_yaml(self) -> str:
        # JSON is YAML: every value quoted correctly whatever the path holds.
        settings = {
            "cluster.name": "lakesync",
            "node.name": "lakesync-search",
            # One node that elects itself; also switches off the production bootstrap
            # checks (vm.max_map_count, file descriptors) that a loopback node skips anyway.
            "discovery.type": "single-node",
            "network.host": "127.0.0.1",
            "http.port": self.port,
            "transport.port": self.transport_port,
            "path.data": str(self.dir / "data"),
            "path.logs": str(self.dir / "logs"),
            # Indices are created on purpose, with mappings (search.ensure_index); a bulk
            # request to a missing index fails loudly instead of guessing its mappings.
            "action.auto_create_index": False,
            # A test machine's disk may be fuller than the 85/90/95% watermarks; a node
            # that turns its indices read-only would fail tests for an unrelated reason.
            "cluster.routing.allocation.disk.threshold_enabled": False,
        }
        return "\n".join(f"{key}: {json.dumps(value)}" for key, value in settings.items()) + "\n"

    def _prepare(self, dist: Path, user: str | None) -> None:
        config = self.dir / "config"
        for folder in (self.dir, self.dir / "data", self.dir / "logs", self.dir / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        if not config.exists():
            shutil.copytree(dist / "config", config)
        (config / "opensearch.yml").write_text(self.settings_yaml())
        # jvm.options names heap-dump, crash and GC log paths relative to the working
        # directory, which the launcher sets to the distribution: point them here instead,
        # so the distribution stays read-only (an unwritable -Xlog file stops the JVM).
        options = (dist / "config" / "jvm.options").read_text()
        options = options.replace("HeapDumpPath=data", f"HeapDumpPath={self.dir / 'data'}")
        options = options.replace("logs/", f"{self.dir / 'logs'}/")
        (config / "jvm.options").write_text(options)
        if user:
            # What we created; what the node writes under data/ and logs/ is its own already.
            for path in (self.dir, self.dir / "data", self.dir / "logs", self.dir / "tmp", config,
                         *config.rglob("*")):
                shutil.chown(path, user, user)
            if not self._user_can(user, "-w", self.dir / "data"):
                raise StackError(f"OpenSearch runs as '{user}', who cannot reach {self.dir}; "
                                 "use a home folder every user can traverse (not under /root)")

    def _readable_distribution(self, dist: Path, user: str | None) -> Path:
        """The distribution itself when the service account can read it, else a copy it owns."""
        if user is None or self._user_can(user, "-x", dist / "bin" / "opensearch"):
            return dist
        copy = self.dir / "dist"
        # The server jar's name carries the version: a newer `make jars` means a new copy.
        server_jar = next((dist / "lib").glob("opensearch-[0-9]*.jar")).name
        if not (copy / "lib" / server_jar).is_file():
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(dist, copy, symlinks=True)
            subprocess.run(["chown", "-R", f"{user}:{user}", str(copy)], check=True)
        return copy

    @staticmethod
    def _user_can(user: str, test: str, path: Path) -> bool:
        return subprocess.run(as_user(user, ["test", test, str(path)])).returncode == 0
