"""A Spark standalone cluster on 127.0.0.1 (LAKESYNC_SPARK_WORKERS > 0): a master and N
workers, each a JVM started from the pyspark package's own `spark-class` (nothing is
downloaded), one core each. The runner, verify, rebuild and bench then run their Spark
driver against it (Settings.spark_master: spark://127.0.0.1:LAKESYNC_SPARK_MASTER_PORT),
their tasks in the workers' executors, the runner on all cores but one
(sync/streaming/spark.py `cluster_cores`); Lakesync's jars reach the executors through
spark.jars, served by the driver.

What the executors and the driver share is the lake alone (here the same disk; on a real
cluster the lake's URI). Each worker keeps its own work folder (the executors' logs and
jars) under HOME/spark/worker-N. A worker that dies takes its executor with it: Spark
runs the lost tasks again on the others, and the runner replays a batch whose kept
intermediate results were on it (sync/commands/runner.py). `up` starts any worker that
is not running, so it also brings a killed one back.
"""

from __future__ import annotations

import os
from pathlib import Path

from sync.config import Settings
from sync.errors import StackError
from sync.stack import jvm
from sync.stack.process import port_open, read_pid, require_free, spawn, stop_pid, wait_until

START_TIMEOUT = 120.0


def spark_home() -> Path:
    """The pyspark package: its bin/spark-class and jars/ are a Spark distribution's."""
    import pyspark

    return Path(pyspark.__file__).parent


class SparkCluster:
    name = "spark"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.run = settings.home / "run"

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.settings.spark_master_port}"

    def pidfile(self, role: str) -> Path:
        """The pid file of `role`: master, worker-1, worker-2, ..."""
        return self.run / f"spark-{role}.pid"

    def _log(self, role: str) -> Path:
        return self.settings.logs / f"spark-{role}.log"

    def _env(self) -> dict[str, str]:
        java = Path(jvm.java()).resolve()
        return {**os.environ, "SPARK_HOME": str(spark_home()), "JAVA_HOME": str(java.parent.parent),
                "SPARK_LOG_DIR": str(self.settings.logs), "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, env: dict[str, str], role: str, main_class: str, *args: str) -> None:
        command = [str(spark_home() / "bin" / "spark-class"), main_class, "--host", "127.0.0.1", *args]
        spawn(command, self.pidfile(role), self._log(role), env=env)

    def workers_running(self) -> int:
        return sum(read_pid(p) is not None for p in self.run.glob("spark-worker-*.pid"))

    def start(self) -> None:
        """The master, then every worker not running (idempotent), each registered."""
        port = self.settings.spark_master_port
        env = self._env()  # (finding Java runs `java -version`: once)
        if read_pid(self.pidfile("master")) is None:
            require_free("127.0.0.1", port, "the Spark master")
            self._spawn(env, "master", "org.apache.spark.deploy.master.Master", "--port", str(port),
                        "--webui-port", str(port + 1))
            wait_until(lambda: port_open("127.0.0.1", port) or self._died("master"), START_TIMEOUT,
                       "the Spark master", self._log("master"))
        for n in range(1, self.settings.spark_workers + 1):
            role = f"worker-{n}"
            if read_pid(self.pidfile(role)) is not None:
                continue
            work = self.settings.home / "spark" / role
            work.mkdir(parents=True, exist_ok=True)
            log = self._log(role)
            since = log.stat().st_size if log.exists() else 0  # (the log is appended to)
            self._spawn(env, role, "org.apache.spark.deploy.worker.Worker", self.url,
                        "--cores", str(self.settings.spark_worker_cores), "--memory",
                        self.settings.spark_worker_memory, "--work-dir", str(work), "--webui-port", "0")
            wait_until(lambda: self._registered(log, since) or self._died(role), START_TIMEOUT,
                       f"Spark {role}", log)

    def _died(self, role: str) -> bool:
        if read_pid(self.pidfile(role)) is None:
            raise StackError(f"Spark {role} exited during start-up; see {self._log(role)}")
        return False

    @staticmethod
    def _registered(log: Path, since: int) -> bool:
        with open(log, "rb") as file:
            file.seek(since)
            return b"Successfully registered with master" in file.read()

    def stop(self) -> None:
        """Every worker, then the master (whatever LAKESYNC_SPARK_WORKERS says now)."""
        for pidfile in [*sorted(self.run.glob("spark-worker-*.pid")), self.pidfile("master")]:
            pid = read_pid(pidfile)
            if pid:
                stop_pid(pid)
            pidfile.unlink(missing_ok=True)
