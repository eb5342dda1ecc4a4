"""Apache Kafka in KRaft mode (one node acting as broker and controller), from Maven jars."""

from __future__ import annotations

import base64
import subprocess
import uuid

from confluent_kafka.admin import AdminClient

from sync.errors import StackError
from sync.stack import jvm
from sync.stack.process import require_free, wait_until


def kafka_ready(bootstrap: str, timeout: float = 2.0) -> bool:
    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0,
                     "logger": _silent}).list_topics(timeout=timeout)
        return True
    except Exception:  # any failure means "not yet": the caller reports the timeout
        return False


class _Silent:
    def log(self, *args, **kwargs) -> None:
        pass


_silent = _Silent()


class Kafka(jvm.JavaService):
    name = "kafka"
    heap = "-Xmx768m"

    def properties(self) -> str:
        s = self.settings
        return "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{s.kafka_controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:{s.kafka_controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{s.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.dir / 'data'}",
            # One node: every internal topic has one replica.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            # Topics are created on purpose, with explicit settings (connectors/).
            "auto.create.topics.enable=false",
            "num.partitions=1",
            "group.initial.rebalance.delay.ms=0",
            # Compaction runs soon enough to be seen in tests and demos.
            "log.cleaner.min.compaction.lag.ms=0",
            "log.segment.bytes=67108864",
            "",
        ])

    def start(self, *java_options: str) -> None:
        if self.running():
            return
        s = self.settings
        require_free("127.0.0.1", s.kafka_port, "Kafka")
        require_free("127.0.0.1", s.kafka_controller_port, "the Kafka controller")
        java = jvm.java()
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        config.write_text(self.properties())
        if not (self.dir / "data" / "meta.properties").exists():
            cluster_id = "-"
            while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid: "-..." reads as an option
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            result = subprocess.run(self.command(java, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                                 "-c", str(config)), capture_output=True, text=True)
            if result.returncode != 0:
                raise StackError(f"formatting Kafka's log directory failed: {result.stdout}{result.stderr}")
        self.launch(java, "kafka.Kafka", config, *java_options)
        wait_until(lambda: self.alive() or kafka_ready(s.kafka_bootstrap), 90, "Kafka", self.log)
