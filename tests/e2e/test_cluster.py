"""The runner on a Spark standalone cluster (`up` with LAKESYNC_SPARK_WORKERS): a master
and two workers of one core on this machine, every batch's tasks in the workers'
executors. One worker is killed (SIGKILL, with its executor) while the bank's clients
write, and `up` starts it again: the runner goes on (Spark reruns the lost tasks; a batch
whose kept results were on that executor is replayed), and Postgres has the last word.
"""

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from sync import config
from sync.demo import bank, bank_clients
from sync.stack.background import start_background, stop_background
from sync.stack.process import read_pid, wait_until
from sync.stack.spark_cluster import SparkCluster
from tests.e2e.conftest import lakesync, open_bank_accounts

pytestmark = pytest.mark.e2e

ACCOUNTS = range(690000, 690004)  # keys no other test uses


def test_the_runner_on_a_standalone_cluster_outlives_a_killed_worker(stack, synced, monkeypatch):
    engine = bank.engine(config.role_dsn(stack, config.ROLES["app"]))
    open_bank_accounts(engine, ACCOUNTS, "Cluster")
    engine.dispose()
    assert stop_background(stack, timeout=60), "the session's runner is not running"
    monkeypatch.setenv("LAKESYNC_SPARK_WORKERS", "2")  # for `up`, the runner and this test's settings
    # The Kafka-fed projections, whose batches keep the most results on executors; the views
    # and event time catch up after it, on the session's runner.
    monkeypatch.setenv("LAKESYNC_PROJECTIONS", "mirrors,changelog,ledger")
    settings = config.load()
    cluster = SparkCluster(settings)
    assert settings.spark_master == cluster.url
    try:
        lakesync("up", check=True)  # the cluster beside the running stack
        assert cluster.workers_running() == 2
        runner = start_background(settings)
        # The runner takes every core but one (one of two workers); a command beside it, the other.
        wait_until(lambda: len(_executors(settings)) == 1, 180, "the runner's executor")
        worker, logs = next(iter(_executors(settings).items()))
        before = _tasks_run(logs)

        writes: dict = {}
        clients = threading.Thread(target=lambda: writes.update(bank_clients(stack, seed=31, clients=2,
                                                                             operations=40)))
        clients.start()
        # Killed while it runs the tasks of the batches applying these writes.
        wait_until(lambda: _tasks_run(logs) > before + 20, 180, "tasks on the runner's executor")
        os.killpg(read_pid(cluster.pidfile(worker)), signal.SIGKILL)  # its executor too
        wait_until(lambda: cluster.workers_running() == 1, 10, "the killed worker gone")
        # The master gives the runner an executor on the other worker.
        wait_until(lambda: len(_executors(settings)) == 2, 180, "the runner's executor on the other worker")
        lakesync("up", check=True)  # starts the killed worker again
        assert cluster.workers_running() == 2
        clients.join(timeout=600)
        assert writes.get("committed", 0) > 0, f"the bank's clients failed (their error above): {writes}"

        synced("accounts", "outbox_sequence", "ledger", "changelog")
        assert read_pid(settings.runner_pidfile) == runner, "the runner did not outlive the lost worker"
        spark = json.loads(lakesync("status", "--json").stdout)["components"]["spark"]
        assert spark["ok"] and spark["workers"] == 2, spark
    finally:
        stop_background(settings, timeout=60)
        cluster.stop()
    assert cluster.workers_running() == 0 and read_pid(cluster.pidfile("master")) is None


def _executors(settings) -> dict[str, list[Path]]:
    """Per worker that has run an executor: their logs (a folder per application and executor)."""
    found = {folder.name: list(folder.glob("app-*/*/stderr")) for folder in (settings.home / "spark").glob("worker-*")}
    return {worker: logs for worker, logs in found.items() if logs}


def _tasks_run(logs: list[Path]) -> int:
    """Tasks these executors have started (their logs' lines)."""
    return sum(log.read_text(errors="replace").count("Running task") for log in logs)
