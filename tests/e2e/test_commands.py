"""The command line on the running stack, and its answers to bad input."""

import json
import socket
import struct

import pytest

from sync.config import TOPIC_PREFIX
from sync.stack import Connect, Kafka, jvm
from sync.stack.process import read_pid, wait_until
from tests.e2e.conftest import connector_compression, lakesync

pytestmark = pytest.mark.e2e


def test_up_is_idempotent_and_reuses_what_runs(stack):
    result = lakesync("up", check=True)
    ready = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "ready (0.0s)" in ready["postgres"]  # it was already running


def test_the_broker_and_the_worker_map_the_class_archives_make_jars_wrote(stack):
    # (A JVM ignores an archive made on another class path, and says so nowhere: QUIET_CDS.)
    for service in (Kafka(stack), Connect(stack)):
        archive = jvm.class_archive(stack.jars, service.name)
        assert archive.is_file(), f"{archive} is missing: `make jars` writes it"
        mapped = open(f"/proc/{read_pid(service.pidfile)}/maps").read()
        assert str(archive) in mapped, f"{service.name} runs without {archive}"


def record_batches(segment):
    """(compression codec, control batch) of each whole record batch of a Kafka log
    segment (format v2: attributes are the int16 after base offset, length, leader epoch,
    magic and CRC)."""
    data = segment.read_bytes()
    position = 0
    while position + 23 <= len(data):
        length, = struct.unpack_from(">i", data, position + 8)
        if length <= 0 or position + 12 + length > len(data):
            break  # (a batch the broker is still writing)
        attributes, = struct.unpack_from(">h", data, position + 21)
        yield attributes & 0x07, bool(attributes & 0x20)
        position += 12 + length


def test_the_connector_writes_the_compression_its_config_names(stack):
    # The broker's own files: the override must reach the exactly-once task's producer
    # (connectors/postgres-source.json).
    configured = connector_compression(stack)
    wanted = ["none", "gzip", "snappy", "lz4", "zstd"].index(configured)  # the batch attribute's numbers
    assert wanted > 0, f"the connector writes uncompressed batches ({configured})"
    folders = [f for f in (Kafka(stack).dir / "data").iterdir() if f.name.startswith(f"{TOPIC_PREFIX}.")]
    codecs = {codec for folder in folders for segment in folder.glob("*.log")
              for codec, control in record_batches(segment) if not control}
    assert folders and codecs == {wanted}, (sorted(f.name for f in folders), codecs)


def test_status_json_has_the_contract_keys(stack, app_db, synced):
    app_db.execute("INSERT INTO customers (id, name) VALUES (5000, 'status') ON CONFLICT DO NOTHING")
    synced("customers", "history.customers")  # a view's figures are read below
    result = lakesync("status", "--json", check=True)
    assert "WARN" not in result.stdout + result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert set(report) >= {"components", "slot_lag_bytes", "projections"}
    components = report["components"]
    assert components["postgres"]["ok"] and "@" in components["postgres"]["dsn"]
    assert ":" not in components["postgres"]["dsn"].split("//", 1)[1].split("@")[0]  # no password
    assert components["kafka"]["ok"] and components["runner"]["ok"]
    assert components["connect"]["ok"] and components["connect"]["tasks"][0]["state"] == "RUNNING"
    assert isinstance(report["slot_lag_bytes"], int)
    transactions = report["transactions"]  # all applied: none held, and a consistent point
    assert (transactions["whole"], transactions["held"], transactions["oldest_held"]) == (True, 0, None)
    assert transactions["held_by"] == {"mirrors": 0, "ledger": 0, "changelog": 0}
    assert set(transactions["point"]) == {"batch", "lsn", "committed_at", "published_at", "offset"}
    customers = next(p for p in report["projections"] if p["name"] == "mirror.customers")
    assert set(customers) >= {"name", "kind", "table", "lag", "last_batch_at", "rows_applied", "dead_letters"}
    assert customers["kind"] == "mirror" and customers["lag"] == 0 and customers["rows_applied"] > 0
    assert customers["table"].endswith("/mirrors/customers")
    # A view's figures too: the views record them under the key status reads them by.
    history = next(p for p in report["projections"] if p["name"] == "history.customers")
    assert history["rows_applied"] > 0 and history["last_batch_at"] is not None


def test_unknown_command_is_a_clear_error():
    result = lakesync("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr


def test_a_snapshot_of_an_unknown_projection_is_a_clear_error():
    result = lakesync("snapshot", "--of", "mirrors,nothing")
    assert result.returncode == 2 and "--of: no projection named nothing" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_wait_for_one_projection_names_it_and_refuses_an_unknown_name(stack):
    result = lakesync("wait", "mirror.customers", "--timeout", "120", check=True)
    assert "fresh: mirrors reflects Postgres" in result.stdout, result.stdout
    result = lakesync("wait", "customers")  # a table, not a target: `mirror.customers` is
    assert result.returncode == 2 and "no projection or target named 'customers'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("variable,value,expected", [
    ("LAKESYNC_CONNECT_URL", "http://127.0.0.1:1", "Kafka Connect is unreachable"),
    ("LAKESYNC_PG_DSN", "postgresql://lakesync_admin@127.0.0.1:1/lakesync", "Postgres is unreachable"),
])
def test_unreachable_services_give_one_line(stack, variable, value, expected):
    result = lakesync("wait", "--timeout", "5", env={variable: value})
    assert result.returncode != 0
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_port_in_use_is_named(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = lakesync("up", env={"LAKESYNC_HOME": str(tmp_path / "home"),
                                     "LAKESYNC_PG_DSN": f"postgresql://lakesync_admin@127.0.0.1:{port}/lakesync"})
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert "Traceback" not in result.stderr


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """The runner's metrics endpoint, as {(name, sorted labels): value}."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_runner_serves_prometheus_metrics(stack, app_db, synced):
    app_db.execute("INSERT INTO customers (id, name) VALUES (5001, 'metrics') ON CONFLICT DO NOTHING")
    synced("customers")
    lag = ("lakesync_lag", (("projection", "mirrors"), ("unit", "records")))
    # The sampler reads lag every few seconds; the barrier above says it is 0 by now.
    wait_until(lambda: _scrape(stack.metrics_port).get(lag) == 0, 60, "a sample showing the mirrors caught up")
    scraped = _scrape(stack.metrics_port)
    assert scraped[("lakesync_up", ())] == 1
    assert scraped[("lakesync_freshness_seconds", (("projection", "mirrors"),))] < 60
    assert scraped[("lakesync_batch_duration_seconds_count", (("projection", "mirrors"),))] > 0
    assert scraped[("lakesync_rows_applied_total", (("projection", "mirrors"), ("table", "customers")))] > 0
    assert ("lakesync_lag", (("projection", "views"), ("unit", "table_versions"))) in scraped


def test_metrics_port_in_use_is_named(stack, tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = lakesync("run", "--once", env={"LAKESYNC_HOME": str(tmp_path / "home"),
                                                "LAKESYNC_METRICS_PORT": str(port)})
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr
