"""Configuration and the rendered connector config."""

import json
import re
from pathlib import Path

import pytest

from sync import config, lake, outbox
from sync.stack import connect
from sync.stack.connect import render_connector
from sync.streaming.spark import BENCH_CLUSTER_APP, RUNNER_APP, artifact, cluster_cores


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


def test_the_lake_is_a_local_directory_or_a_bucket_and_other_uris_are_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKESYNC_LAKE", f"file://{tmp_path}/my%20lake")
    assert config.load().lake == tmp_path / "my lake"
    monkeypatch.setenv("LAKESYNC_LAKE", "lake")
    assert config.load().lake == tmp_path / "lake"
    for uri, bucket, key in (("s3a://bucket/the/lake/", "bucket", "the/lake"), ("s3://bucket", "bucket", "")):
        monkeypatch.setenv("LAKESYNC_LAKE", uri)
        assert config.load().lake == lake.ObjectPath(bucket, key)
    assert str(config.load().lake / "_catalog" / "mirrors.json") == "s3a://bucket/_catalog/mirrors.json"
    assert lake.reader_uri("s3a://bucket/the/lake/mirrors/orders") == "s3://bucket/the/lake/mirrors/orders"
    for uri, says in (("hdfs://namenode:8020/lake", "a hdfs: URI is not supported"),
                      ("abfss://c@account.dfs.core.windows.net/lake", "a abfss: URI is not supported"),
                      ("s3a:///lake", "names no bucket")):
        monkeypatch.setenv("LAKESYNC_LAKE", uri)
        with pytest.raises(config.LakesyncError, match=rf"^LAKESYNC_LAKE={re.escape(uri)}: .*{says}") as raised:
            config.load()
        assert "\n" not in str(raised.value)
    # Before, such a value became a folder named after the URI under the working directory.
    assert not (tmp_path / "s3a:").exists() and not (tmp_path / "hdfs:").exists()


def test_an_object_path_names_like_a_path():
    orders = lake.ObjectPath("bucket", "lake/mirrors/orders")
    offsets = orders / "_delta_log" / "00000000000000000007.json"
    assert (offsets.name, offsets.stem, offsets.suffix) == ("00000000000000000007.json", "00000000000000000007",
                                                            ".json")
    assert offsets.parent.parent == orders and orders.parent.parent == lake.ObjectPath("bucket", "lake")
    assert str(offsets.with_suffix(".crc")) == "s3a://bucket/lake/mirrors/orders/_delta_log/00000000000000000007.crc"
    assert lake.at(str(orders)) == orders and lake.at(orders) is orders


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


def test_connector_names_come_from_sync_config(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    name, rendered = render_connector(config.load())
    assert name == config.CONNECTOR_NAME
    assert rendered["slot.name"] == config.SLOT
    assert rendered["publication.name"] == config.PUBLICATION
    assert rendered["topic.prefix"] == config.TOPIC_PREFIX
    assert rendered["database.user"] == config.ROLES["capture"]
    assert rendered["table.include.list"] == (f"{re.escape(config.DEFAULT_SCHEMA)}\\..*,"
                                              f"{re.escape(config.HEARTBEAT_TABLE)},"
                                              f"{re.escape(config.TABLE_DROPS_TABLE)},"
                                              f"{re.escape(config.COLUMN_CHANGES_TABLE)},"
                                              f"{re.escape(config.SIGNAL_TABLE)}")
    assert rendered["signal.data.collection"] == config.SIGNAL_TABLE
    assert rendered["heartbeat.action.query"].startswith(f"INSERT INTO {config.HEARTBEAT_TABLE} (id, beat_at) ")
    # The patterns match the topics they are meant for, and only those.
    outbox_table = re.compile(rendered["predicates.isOutbox.pattern"])
    assert outbox_table.fullmatch(f"{config.TOPIC_PREFIX}.public.outbox")
    assert not outbox_table.fullmatch(f"{config.TOPIC_PREFIX}.{config.DEFAULT_SCHEMA}xoutbox")
    assert not outbox_table.fullmatch(f"{config.TOPIC_PREFIX}.inventory.outbox")
    events = re.compile(rendered["topic.creation.events.include"])
    assert events.fullmatch(outbox.topic("account"))
    assert not events.fullmatch(f"{config.TOPIC_PREFIX}.{config.DEFAULT_SCHEMA}.accounts")
    # Debezium's and Connect's own ${...} are theirs to fill.
    assert rendered["transforms.outbox.route.topic.replacement"] == outbox.EVENTS_TOPIC_PREFIX + "${routedByValue}"
    assert rendered["database.password"].startswith("${file:")
    assert not any("${lakesync:" in value for value in [name, *rendered.values()])


def test_connector_template_holds_no_name_of_its_own(monkeypatch, tmp_path):
    """Every name is a placeholder: other values in sync/config.py give another config."""
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    monkeypatch.setenv("LAKESYNC_PG_DSN", "postgresql://me@db.internal:6543/shop")
    monkeypatch.setenv("LAKESYNC_CAPTURE", "xcaptured_schema")
    for constant in ("CONNECTOR_NAME", "TOPIC_PREFIX", "CONTROL_SCHEMA", "PUBLICATION", "SLOT"):
        monkeypatch.setattr(connect, constant, f"x{constant.lower()}")
    monkeypatch.setattr(connect, "HEARTBEAT_TABLE", "xcontrol.xbeat")
    monkeypatch.setattr(connect, "TABLE_DROPS_TABLE", "xcontrol.xdrops")
    monkeypatch.setattr(connect, "SIGNAL_TABLE", "xcontrol.xsignal")
    monkeypatch.setattr(connect, "COLUMN_CHANGES_TABLE", "xcontrol.xcolumns")
    monkeypatch.setenv("LAKESYNC_OUTBOX", "xcaptured_schema.outbox")
    monkeypatch.setattr(connect, "EVENTS_TOPIC_PREFIX", "xtopics.xevents.")
    monkeypatch.setitem(config.ROLES, "capture", "xcapture")
    name, rendered = render_connector(config.load())
    assert name == "xconnector_name"
    assert (rendered["slot.name"], rendered["publication.name"], rendered["topic.prefix"], rendered["database.user"]) \
        == ("xslot", "xpublication", "xtopic_prefix", "xcapture")
    assert rendered["table.include.list"] == "xcaptured_schema\\..*,xcontrol\\.xbeat,xcontrol\\.xdrops,xcontrol\\.xcolumns,xcontrol\\.xsignal"
    assert rendered["predicates.isOutbox.pattern"] == "xtopic_prefix\\.xcaptured_schema\\.outbox"
    assert rendered["topic.creation.events.include"] == "xtopics\\.xevents\\..*"
    assert "INTO xcontrol.xbeat " in rendered["heartbeat.action.query"]
    # Nothing else in the config names the project (the Java classes are ours: io.lakesync).
    leftover = {key: value for key, value in rendered.items() if "lakesync" in value.replace("io.lakesync.", "")}
    assert leftover == {}


def test_topic_partitions_are_a_setting_and_the_ordered_topics_keep_one(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    assert render_connector(config.load())[1]["topic.creation.default.partitions"] == "1"
    monkeypatch.setenv("LAKESYNC_TOPIC_PARTITIONS", "4")
    rendered = render_connector(config.load())[1]
    assert rendered["topic.creation.default.partitions"] == "4"
    assert "ordered" in rendered["topic.creation.groups"].split(",")
    assert rendered["topic.creation.ordered.partitions"] == "1"
    ordered = [re.compile(p) for p in rendered["topic.creation.ordered.include"].split(",")]
    for name in (f"{config.TOPIC_PREFIX}.transaction", f"{config.TOPIC_PREFIX}.{config.TABLE_DROPS_TABLE}",
                 f"{config.TOPIC_PREFIX}.{config.COLUMN_CHANGES_TABLE}"):
        assert any(p.fullmatch(name) for p in ordered)
    assert not any(p.fullmatch(f"{config.TOPIC_PREFIX}.public.accounts") for p in ordered)
    assert rendered["topic.creation.ordered.min.compaction.lag.ms"] == str(config.COMPACTION_LAG_MS)
    # Across partitions, only the transaction topic orders the changes: the two go together.
    monkeypatch.setenv("LAKESYNC_WHOLE_TRANSACTIONS", "off")
    with pytest.raises(config.LakesyncError, match="LAKESYNC_TOPIC_PARTITIONS=4 needs whole source transactions"):
        config.load()
    for bad in ("0", "four"):
        monkeypatch.setenv("LAKESYNC_TOPIC_PARTITIONS", bad)
        with pytest.raises(config.LakesyncError, match="LAKESYNC_TOPIC_PARTITIONS"):
            config.load()


def test_connector_template_placeholders_are_all_known():
    spec = json.loads(connect.CONNECTOR_TEMPLATE.read_text())
    used = {m.group(1) for entry in [{"value": spec["name"]}, *spec["config"].values()]
            for m in connect.PLACEHOLDER.finditer(entry["value"])}
    assert used <= set(connect.connector_names()) | {"pg_host", "pg_port", "pg_database", "secrets_file",
                                                     "capture_include_list", "outbox_table", "topic_partitions"}
    assert all("doc" in entry for entry in spec["config"].values())  # each property says why it is set


def test_spark_settings_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("LAKESYNC_SPARK_DRIVER_MEMORY", raising=False)
    assert config.load().spark_driver_memory == "3g"
    monkeypatch.setenv("LAKESYNC_SPARK_DRIVER_MEMORY", "5g")
    assert config.load().spark_driver_memory == "5g"


def test_workers_put_every_spark_process_on_the_cluster_up_starts_the_runner_on_all_cores_but_one(monkeypatch):
    for name in ("LAKESYNC_SPARK_MASTER", "LAKESYNC_SPARK_WORKERS", "LAKESYNC_SPARK_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert (config.load().spark_master, config.load().spark_workers) == ("local[*]", 0)
    monkeypatch.setenv("LAKESYNC_SPARK_WORKERS", "3")
    monkeypatch.setenv("LAKESYNC_SPARK_MASTER_PORT", "27999")
    settings = config.load()
    assert settings.spark_master == "spark://127.0.0.1:27999"
    assert (cluster_cores(settings, RUNNER_APP), cluster_cores(settings, "lakesync-verify")) == (2, 1)
    assert cluster_cores(settings, BENCH_CLUSTER_APP) == 3  # the bench's step 6, alone on its own cluster
    monkeypatch.setenv("LAKESYNC_SPARK_WORKERS", "1")
    assert (cluster_cores(config.load(), RUNNER_APP), cluster_cores(config.load(), "lakesync-verify")) == (1, 1)
    monkeypatch.setenv("LAKESYNC_SPARK_MASTER", "spark://spark.internal:7077")  # a cluster of the team's own
    assert config.load().spark_master == "spark://spark.internal:7077"
    monkeypatch.setenv("LAKESYNC_SPARK_WORKERS", "two")
    with pytest.raises(config.LakesyncError, match="^LAKESYNC_SPARK_WORKERS must be a whole number"):
        config.load()


def test_jar_artifact_names_ignore_versions():
    assert artifact(Path("jackson-core-2.13.5.jar")) == "jackson-core"
    assert artifact(Path("delta-spark_4.2_2.13-4.4.0.jar")) == "delta-spark_4.2_2.13"
    assert artifact(Path("zstd-jni-1.5.7-3.jar")) == "zstd-jni"


def test_the_capture_set_renders_into_the_connector(monkeypatch, tmp_path):
    """LAKESYNC_CAPTURE: whole schemas and schema.PATTERN entries, as Debezium's include list."""
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    monkeypatch.setenv("LAKESYNC_CAPTURE", " public, inventory ,billing.invoice(s|_lines),public")
    settings = config.load()
    assert settings.capture.schemas == ["billing", "inventory", "public"]
    assert str(settings.capture) == "public,inventory,billing.invoice(s|_lines)"
    _, rendered = render_connector(settings)
    include = rendered["table.include.list"].split(",")
    assert include[:3] == ["public\\..*", "inventory\\..*", "billing\\.invoice(s|_lines)"]
    debezium = [re.compile(pattern) for pattern in include]  # matched against schema.table, whole
    captured = lambda name: any(p.fullmatch(name) for p in debezium)  # noqa: E731
    for schema, table, expected in [("public", "orders", True), ("inventory", "Stock Items", True),
                                    ("billing", "invoices", True), ("billing", "invoice_lines", True),
                                    ("billing", "invoices_old", False), ("billing", "drafts", False),
                                    ("other", "orders", False)]:
        assert settings.capture.captures(schema, table) is expected, (schema, table)
        assert captured(f"{schema}.{table}") is expected, (schema, table)


@pytest.mark.parametrize("text, message", [
    ("", "names no table"),
    (" , ", "names no table"),
    (".orders", "names no schema"),
    ("lakesync", "Lakesync's own"),
    ("events.x", "Lakesync's own"),
    ("app.orders(", "not a regular expression"),
])
def test_a_capture_set_that_cannot_be_captured_is_refused_in_one_line(text, message):
    with pytest.raises(config.LakesyncError) as refused:
        config.parse_capture(text)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_runuser_is_found_outside_a_root_shells_path_or_named_in_one_line(monkeypatch):
    """A root shell's PATH may lack /usr/sbin, where util-linux installs runuser."""
    from sync.errors import StackError
    from sync.stack import process

    monkeypatch.setenv("PATH", "/bin")
    assert process.as_user(None, ["true"]) == ["true"]
    command = process.as_user("postgres", ["true"])
    assert Path(command[0]).name == "runuser" and Path(command[0]).is_absolute() and command[1:] == [
        "-u", "postgres", "--", "true"]
    monkeypatch.setattr(process.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(StackError, match="runuser, which is not on PATH nor in /usr/sbin"):
        process.as_user("postgres", ["true"])
