"""Configuration and the rendered connector config."""

from pathlib import Path

from sync import config
from sync.streaming.spark import artifact
from sync.stack.connect import render_connector


def test_defaults_point_at_the_embedded_stack(monkeypatch):
    for name in ("LAKESYNC_PG_DSN", "LAKESYNC_KAFKA_BOOTSTRAP", "LAKESYNC_CONNECT_URL"):
        monkeypatch.delenv(name, raising=False)
    s = config.load()
    assert (s.pg_host, s.pg_port, s.pg_database) == ("127.0.0.1", 15432, "lakesync")
    assert (s.kafka_port, s.kafka_controller_port, s.connect_port) == (19092, 19093, 18083)


def test_addresses_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    monkeypatch.setenv("LAKESYNC_PG_DSN", "postgresql://me@db.internal:6543/shop")
    s = config.load()
    assert (s.pg_host, s.pg_port, s.pg_database) == ("db.internal", 6543, "shop")
    assert s.lake == tmp_path / "lake"


def test_safe_dsn_drops_the_password():
    assert config.safe_dsn("postgresql://u:secret@h:5/db") == "postgresql://u@h:5/db"
    assert config.safe_dsn("postgresql://u@h:5/db") == "postgresql://u@h:5/db"


def test_connector_config_is_exact_and_keeps_the_password_out(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    name, rendered = render_connector(config.load())
    assert name == config.CONNECTOR_NAME
    assert rendered["database.password"] == f"${{file:{tmp_path / 'secrets.properties'}:capture_password}}"
    assert rendered["decimal.handling.mode"] == "string"
    assert rendered["skipped.operations"] == "none"
    assert rendered["plugin.name"] == "pgoutput"
    assert rendered["publication.autocreate.mode"] == "disabled"
    assert rendered["topic.creation.default.cleanup.policy"] == "compact"
    assert not any("{{" in value for value in rendered.values())


def test_jar_artifact_names_ignore_versions():
    assert artifact(Path("jackson-core-2.13.5.jar")) == "jackson-core"
    assert artifact(Path("delta-spark_4.2_2.13-4.4.0.jar")) == "delta-spark_4.2_2.13"
    assert artifact(Path("zstd-jni-1.5.7-3.jar")) == "zstd-jni"
