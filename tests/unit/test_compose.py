"""docker-compose.yml is a valid Compose file and sets up what the embedded stack runs.

No Docker engine here: the file is loaded by compose-go, the loader Docker Compose v2
itself uses (tests/compose, built by `make test` into build/composecheck), and what it
loads is compared with the embedded stack's own settings (sync/stack)."""

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sync import config
from sync.stack.connect import Connect
from sync.stack.kafka import Kafka

COMPOSE = config.ROOT / "docker-compose.yml"
CHECKER = config.ROOT / "build" / "composecheck"
# Where each side runs, so where they must differ.
PLACES = {"bootstrap.servers", "listeners", "rest.advertised.host.name", "rest.advertised.port", "plugin.path",
          "controller.quorum.voters", "advertised.listeners", "inter.broker.listener.name",
          "listener.security.protocol.map", "log.dirs", "node.id", "process.roles", "controller.listener.names"}
# The Debezium image's own names for these worker settings (its docker-entrypoint.sh).
CONNECT_NAMES = {"BOOTSTRAP_SERVERS": "bootstrap.servers", "GROUP_ID": "group.id",
                 "CONFIG_STORAGE_TOPIC": "config.storage.topic", "OFFSET_STORAGE_TOPIC": "offset.storage.topic",
                 "STATUS_STORAGE_TOPIC": "status.storage.topic", "KEY_CONVERTER": "key.converter",
                 "VALUE_CONVERTER": "value.converter", "OFFSET_FLUSH_INTERVAL_MS": "offset.flush.interval.ms"}


def load(path: Path) -> subprocess.CompletedProcess:
    assert CHECKER.is_file(), f"{CHECKER} is missing: `make test` builds it (Go, tests/compose)"
    return subprocess.run([str(CHECKER), str(path)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def project():
    loaded = load(COMPOSE)
    assert loaded.returncode == 0, loaded.stderr
    return json.loads(loaded.stdout)


@pytest.fixture(scope="module")
def header():
    """The environment docker-compose.yml's header tells the user to export."""
    exports = {}
    for line in COMPOSE.read_text().splitlines():
        if line.startswith("#   export "):
            exports.update(re.findall(r"(\w+)=(\S+)", line))
    return exports


def pom_property(path: str, name: str) -> str:
    found = ET.parse(config.ROOT / path).getroot().find(f".//{{http://maven.apache.org/POM/4.0.0}}{name}")
    assert found is not None, name
    return found.text


def tag(service: dict) -> str:
    return service["image"].rsplit(":", 1)[1]


def test_the_checker_refuses_what_docker_compose_refuses(tmp_path):
    bad = tmp_path / "compose.yml"
    bad.write_text("services:\n  a:\n    image: x\n    depends_on:\n      b: {condition: service_healthy}\n")
    loaded = load(bad)
    assert loaded.returncode == 1 and "depends on undefined service" in loaded.stderr, loaded.stderr
    bad.write_text("services:\n  a:\n    image: x\n    restart_policy: always\n")
    assert load(bad).returncode == 1


def test_every_service_is_healthy_before_connect_starts(project):
    services = project["services"]
    assert set(services) == {"postgres", "kafka", "connect", "opensearch"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert {name: d["condition"] for name, d in services["connect"]["depends_on"].items()} == {
        "kafka": "service_healthy", "postgres": "service_healthy"}


def test_the_images_are_the_embedded_stacks_versions(project):
    services = project["services"]
    assert tag(services["kafka"]) == pom_property("jvm/pom.xml", "kafka.version")
    assert tag(services["connect"]) == pom_property("jvm/pom.xml", "debezium.version")
    assert tag(services["opensearch"]) == pom_property("jvm/opensearch/pom.xml", "opensearch.version")
    assert int(tag(services["postgres"])) >= 15


def test_the_connect_worker_and_the_broker_are_set_up_as_the_embedded_ones(project):
    settings = config.load()
    environment = project["services"]["connect"]["environment"]
    worker = {CONNECT_NAMES.get(k) or k.removeprefix("CONNECT_").lower().replace("_", "."): v
              for k, v in environment.items() if k in CONNECT_NAMES or k.startswith("CONNECT_")}
    embedded = {k: v for k, v in config.parse_properties(Connect(settings).properties()).items() if k not in PLACES}
    assert {k: worker.get(k) for k in embedded} == embedded
    broker = {k.removeprefix("KAFKA_").lower().replace("_", "."): v
              for k, v in project["services"]["kafka"]["environment"].items()}
    embedded = {k: v for k, v in config.parse_properties(Kafka(settings).properties()).items() if k not in PLACES}
    assert {k: broker.get(k) for k in embedded} == embedded


def test_the_headers_environment_reaches_these_services(project, header):
    """The three errors of issue 23: no search node; a secrets file Connect could not read;
    PGPASSWORD overriding the passwords of Lakesync's roles."""
    services = project["services"]
    published = {name: {int(p["published"]) for p in s.get("ports", [])} for name, s in services.items()}
    dsn = urlsplit(header["LAKESYNC_PG_DSN"])
    postgres = services["postgres"]["environment"]
    assert (dsn.username, dsn.password, dsn.path.lstrip("/")) == (
        config.ADMIN_ROLE, postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])
    assert postgres["POSTGRES_USER"] == config.ADMIN_ROLE and "wal_level=logical" in services["postgres"]["command"]
    assert "PGPASSWORD" not in header
    assert dsn.port in published["postgres"]
    assert urlsplit("//" + header["LAKESYNC_KAFKA_BOOTSTRAP"]).port in published["kafka"]
    assert urlsplit(header["LAKESYNC_CONNECT_URL"]).port in published["connect"]
    assert urlsplit(header["LAKESYNC_SEARCH_URL"]).port in published["opensearch"]
    # The secrets file `up --external` writes (mode 0600) into LAKESYNC_HOME, seen by Connect.
    home = header["LAKESYNC_HOME"].replace("$PWD", str(config.ROOT))
    mounts = {v["target"]: v["source"] for v in services["connect"]["volumes"]}
    secrets = Path(header["LAKESYNC_CONNECT_SECRETS_FILE"])
    assert mounts[str(secrets.parent)] == home and secrets.name == config.load().secrets_file.name
    assert services["connect"]["user"] in ("root", "0")
    host, port = header["LAKESYNC_CONNECT_PG_ADDRESS"].split(":")
    assert host == "postgres" and int(port) in {int(p["target"]) for p in services["postgres"]["ports"]}
    plugin = mounts["/kafka/connect/lakesync-connect"]
    assert plugin == str(config.ROOT / "build" / "jvm" / "plugins" / "lakesync-connect")
