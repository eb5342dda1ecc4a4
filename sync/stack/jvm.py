"""Java for the Kafka broker and the Connect worker, and their jars from build/jvm/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from sync.config import Settings
from sync.errors import StackError
from sync.stack.process import read_pid, spawn, stop_pid

MIN_JAVA = 17  # Kafka 4 brokers and Connect workers, and Spark 4, need Java 17+
# Class-data sharing quiet: a mismatched archive (another class path) is ignored, and is
# no reason to print to a command's output or a service's log.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c{1})%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
logger.debezium.name = io.debezium
logger.debezium.level = INFO
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = INFO
"""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    binary = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not binary or not Path(binary).exists():
        raise StackError(f"Java {MIN_JAVA}+ is required and was not found (install openjdk-17-jre-headless "
                         "or set JAVA_HOME)")
    out = subprocess.run([binary, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise StackError(f"Java {MIN_JAVA}+ is required; {binary} reports: {out.splitlines()[0] if out else '?'}")
    return binary


def classpath(jars: Path, group: str) -> str:
    folder = jars / group
    if not folder.is_dir() or not any(folder.glob("*.jar")):
        raise StackError(f"the {group} jars are missing in {folder}; run `make jars` (needs Maven)")
    return f"{folder}/*"


def class_archive(jars: Path, service: str) -> Path:
    """The classes `service` (kafka, connect) loads as it starts, parsed and verified once
    at build (`make jars`, sync/stack `archive_classes`) and mapped by each later JVM of it
    (the broker's log-directory format too). Here a broker answers in 2.6-2.9 s instead of
    3.8-4.2 s (4.8-5.2 CPU-s instead of 6.6-7.2), a worker in 2.4-3.1 s instead of
    4.1-5.1 s (3.5-4.2 CPU-s instead of 6.4-6.5): docs/benchmark.md."""
    return jars / f"{service}-classes.jsa"


def log4j_config(home: Path) -> Path:
    path = home / "log4j2.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != LOG4J2:
        path.write_text(LOG4J2)
    return path


class JavaService:
    """A JVM process of the embedded stack: its folder, pid file, log, start and stop."""

    name = ""
    heap = "-Xmx512m"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.dir = settings.home / self.name
        self.pidfile = settings.home / "run" / f"{self.name}.pid"
        self.log = settings.logs / f"{self.name}.log"

    def running(self) -> bool:
        return read_pid(self.pidfile) is not None

    def command(self, java_binary: str, main_class: str, *args: str) -> list[str]:
        """A java command line on the Kafka classpath, logging through our log4j2 config,
        mapping the class archive if there is one."""
        archive = class_archive(self.settings.jars, self.name)
        sharing = [f"-XX:SharedArchiveFile={archive}", *QUIET_CDS.split()] if archive.exists() else []
        return [java_binary, *sharing, f"-Dlog4j2.configurationFile={log4j_config(self.settings.home)}",
                "-cp", classpath(self.settings.jars, "kafka"), main_class, *args]

    def launch(self, java_binary: str, main_class: str, config: Path, *java_options: str) -> None:
        java, *rest = self.command(java_binary, main_class, str(config))
        spawn([java, "-Xms256m", self.heap, "-XX:+UseG1GC", "-Djava.awt.headless=true", *java_options, *rest],
              self.pidfile, self.log)

    def alive(self) -> None:
        """Raise at once if the process died while we wait for it to become ready."""
        if not self.running():
            raise StackError(f"{self.name} exited during start-up; see {self.log}")

    def stop(self) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            stop_pid(pid)
        self.pidfile.unlink(missing_ok=True)
