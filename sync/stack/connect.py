"""Kafka Connect in distributed mode (one worker) with the Debezium Postgres connector.

The worker keeps connector configs, source offsets and task status in three compacted
topics (Connect creates them so). The connector config lives in connectors/ as a template
whose names (slot, publication, topic prefix, role, schemas) come from sync/config.py, and is
registered with PUT /connectors/NAME/config, which creates or updates: idempotent.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

from sync.config import (COLUMN_CHANGES_TABLE, COMPACTION_LAG_MS, CONNECTOR_NAME, CONTROL_SCHEMA, EVENTS_TOPIC_PREFIX,
                         HEARTBEAT_MAX_AGE_SECONDS, HEARTBEAT_TABLE, HEARTBEAT_WAL_BYTES,
                         PUBLICATION, ROLES, ROOT, SIGNAL_TABLE, SLOT, TABLE_DROPS_TABLE, TOPIC_PREFIX, Settings)
from sync.errors import ServiceUnavailable, StackError
from sync.stack import jvm
from sync.stack.process import require_free, wait_until

CONNECTOR_TEMPLATE = ROOT / "connectors" / "postgres-source.json"


def rest(settings: Settings, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
    """One call to the Connect REST API; JSON in, JSON out."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{settings.connect_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")
        try:
            detail = json.loads(detail).get("message", detail)
        except ValueError:
            pass
        raise ServiceUnavailable(f"Kafka Connect {method} {path} answered {error.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ServiceUnavailable(f"Kafka Connect is unreachable at {settings.connect_url} ({error})") from None
    return json.loads(raw) if raw else None


# ${lakesync:NAME} or ${lakesync:NAME|regex} (NAME regex-escaped, for the properties that take
# a pattern). Connect's config providers (${file:...}) and Debezium's ${routedByValue} use
# other prefixes and are left for them.
PLACEHOLDER = re.compile(r"\$\{lakesync:(\w+)(\|regex)?\}")


def connector_names() -> dict[str, str]:
    """The names the template takes from sync/config.py (one source for each)."""
    return {
        "CONNECTOR_NAME": CONNECTOR_NAME, "TOPIC_PREFIX": TOPIC_PREFIX,
        "CONTROL_SCHEMA": CONTROL_SCHEMA, "HEARTBEAT_TABLE": HEARTBEAT_TABLE, "TABLE_DROPS_TABLE": TABLE_DROPS_TABLE,
        "HEARTBEAT_WAL_BYTES": str(HEARTBEAT_WAL_BYTES), "HEARTBEAT_MAX_AGE_SECONDS": str(HEARTBEAT_MAX_AGE_SECONDS),
        "SIGNAL_TABLE": SIGNAL_TABLE, "COLUMN_CHANGES_TABLE": COLUMN_CHANGES_TABLE,
        "PUBLICATION": PUBLICATION,
        "SLOT": SLOT, "CAPTURE_ROLE": ROLES["capture"],
        "EVENTS_TOPIC_PREFIX": EVENTS_TOPIC_PREFIX,  # the outbox router's topics
        "COMPACTION_LAG_MS": str(COMPACTION_LAG_MS),
    }


def render_connector(settings: Settings) -> tuple[str, dict[str, str]]:
    """The connector's name and config with placeholders filled and docs dropped."""
    spec = json.loads(CONNECTOR_TEMPLATE.read_text())
    values = {**connector_names(),
              # Addresses as the Connect worker sees them (another host/path in a container).
              "pg_host": settings.connect_pg_host, "pg_port": str(settings.connect_pg_port),
              "pg_database": settings.pg_database, "secrets_file": str(settings.connect_secrets_file),
              # The capture set as Debezium's patterns (already regular expressions).
              "capture_include_list": ",".join(settings.capture.include_list()),
              "outbox_table": settings.outbox_table, "topic_partitions": str(settings.topic_partitions)}

    def fill(match: re.Match) -> str:
        name, regex = match.groups()
        if name not in values:
            raise StackError(f"{CONNECTOR_TEMPLATE}: unknown placeholder {match.group(0)}")
        return re.escape(values[name]) if regex else values[name]

    name = PLACEHOLDER.sub(fill, spec["name"])
    return name, {key: PLACEHOLDER.sub(fill, entry["value"]) for key, entry in spec["config"].items()}


def source_offset(settings: Settings) -> dict[str, Any]:
    """The connector's committed source offset (empty before its first commit)."""
    answer = rest(settings, "GET", f"/connectors/{CONNECTOR_NAME}/offsets")
    return next((entry.get("offset") or {} for entry in answer.get("offsets", [])), {})


def offset_lsn(offset: dict[str, Any]) -> int:
    """The highest LSN a source offset names (0 for none)."""
    return max([int(offset[k]) for k in ("lsn", "lsn_proc", "lsn_commit") if offset.get(k)], default=0)


def connector_status(settings: Settings) -> dict[str, Any]:
    return rest(settings, "GET", f"/connectors/{CONNECTOR_NAME}/status")


def wait_for_state(settings: Settings, state: str, timeout: float = 60) -> None:
    """Until the connector and each of its tasks report `state` (PAUSED, STOPPED, ...).
    A task reports PAUSED between polls, after its last batch's transaction committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = connector_status(settings)
        if status["connector"]["state"] == state and all(t["state"] == state for t in status.get("tasks", [])):
            return
        time.sleep(0.5)
    raise StackError(f"the connector did not reach {state} within {timeout:.0f}s")


class Connect(jvm.JavaService):
    name = "connect"
    heap = "-Xmx1g"

    def properties(self) -> str:
        s = self.settings
        return "\n".join([
            f"bootstrap.servers={s.kafka_bootstrap}",
            "group.id=lakesync-connect",
            f"listeners=http://127.0.0.1:{s.connect_port}",
            "rest.advertised.host.name=127.0.0.1",
            f"rest.advertised.port={s.connect_port}",
            # The worker's own state: compacted topics, one replica on one broker.
            "config.storage.topic=lakesync-connect-configs",
            "offset.storage.topic=lakesync-connect-offsets",
            "status.storage.topic=lakesync-connect-status",
            "config.storage.replication.factor=1",
            "offset.storage.replication.factor=1",
            "offset.storage.partitions=1",
            "status.storage.replication.factor=1",
            "status.storage.partitions=1",
            # Change events as JSON with their schema: the runner needs column types.
            "key.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable=true",
            "value.converter.schemas.enable=true",
            # Kafka 3.5+ writes a column's default in place of an explicit NULL unless told
            # not to: a NULL must stay NULL.
            "key.converter.replace.null.with.default=false",
            "value.converter.replace.null.with.default=false",
            # Exactly-once source (KIP-618): each poll's records and its source offsets are
            # written in one Kafka transaction, so a worker crash neither loses nor
            # duplicates what the connector had produced. Needs the broker's transaction
            # log (sync/stack/kafka.py) and read_committed consumers (the projections).
            # Committed source offsets are what `lakesync wait` reads; commit them often.
            "offset.flush.interval.ms=1000",
            f"plugin.path={s.jars / 'plugins'}",
            # Plugins found by their ServiceLoader manifests (KIP-898), which Debezium's jars,
            # Kafka's and ours (jvm/smt) have, instead of a reflective scan of every class
            # on the plugin path and the class path: the scan was 7-8 s of each start here.
            "plugin.discovery=service_load",
            "topic.creation.enable=true",
            "exactly.once.source.support=enabled",
            "config.providers=file",
            "config.providers.file.class=org.apache.kafka.common.config.provider.FileConfigProvider",
            "",
        ])

    def start(self) -> None:
        self.start_worker()
        self.register()

    def start_worker(self, *java_options: str) -> None:
        """The worker, unless it runs, until its REST API answers."""
        if self.running():
            return
        s = self.settings
        require_free("127.0.0.1", s.connect_port, "Kafka Connect")
        java = jvm.java()
        if not (s.jars / "plugins" / "debezium-connector-postgres").is_dir():
            raise StackError(f"the Debezium plugin is missing in {s.jars / 'plugins'}; run `make jars`")
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "connect-distributed.properties"
        config.write_text(self.properties())
        self.launch(java, "org.apache.kafka.connect.cli.ConnectDistributed", config, *java_options)
        wait_until(lambda: self.alive() or self._answers(), 120, "Kafka Connect", self.log)

    def _answers(self) -> bool:
        try:
            rest(self.settings, "GET", "/connector-plugins", timeout=3)
            return True
        except ServiceUnavailable:
            return False

    def register(self) -> None:
        """PUT the rendered config (create or update), then wait for a RUNNING task."""
        self.configure()
        self.wait_streaming()

    def configure(self) -> None:
        """PUT the rendered config (a stopped connector stays stopped)."""
        name, config = render_connector(self.settings)
        rest(self.settings, "PUT", f"/connectors/{name}/config", config, timeout=60)

    def wait_streaming(self) -> None:
        """Until the connector's task runs and has committed a source offset (one restart
        of a failed task); a task that fails again: one line naming its error."""
        name = CONNECTOR_NAME
        deadline = time.monotonic() + 90
        state = "unknown"
        restarted = False
        while time.monotonic() < deadline:
            try:
                status = connector_status(self.settings)
            except ServiceUnavailable:
                time.sleep(0.5)
                continue
            tasks = status.get("tasks", [])
            state = f"connector {status['connector']['state']}, tasks {[t['state'] for t in tasks]}"
            failed = [t for t in tasks if t["state"] == "FAILED"]
            if failed and not restarted:
                # `up` starts what is not running: a task that failed (Postgres or Kafka went
                # away for longer than its retries) gets one restart from its last offset.
                rest(self.settings, "POST", f"/connectors/{name}/restart?includeTasks=true&onlyFailed=true")
                restarted = True
                time.sleep(2)
                continue
            if failed:
                trace = (failed[0].get("trace") or "").splitlines()
                raise StackError(f"Debezium task failed: {trace[0] if trace else 'no trace'}; see {self.log}")
            running = status["connector"]["state"] == "RUNNING" and tasks and all(t["state"] == "RUNNING" for t in tasks)
            # A RUNNING task may still be retrying a failed snapshot in place; it streams
            # once it has committed a source offset.
            if running and rest(self.settings, "GET", f"/connectors/{name}/offsets").get("offsets"):
                return
            time.sleep(0.5)
        raise StackError(f"the Debezium connector is not streaming after 90s ({state}); "
                         f"last error: {self.last_error()}; see {self.log}")

    def last_error(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "none logged"
        causes = [line for line in lines if line.startswith("Caused by:")]
        return causes[-1][len("Caused by: "):][:300] if causes else "none logged"
