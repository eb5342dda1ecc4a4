"""The chaos run: faults at random moments under a concurrent workload, then the oracle.

While two clients keep writing multi-table transactions and a bank client moves money
through the outbox, the runner is killed with SIGKILL five times at random moments
(restarted each time), and the Connect worker, the Kafka broker and Postgres are each
restarted once. At the end the barrier and verify must show every mirror equal to
Postgres, no key held twice, the changelog holding every record once, and the ledger
holding every posting once with intact chains and balances equal to Postgres: nothing
lost, nothing doubled. The consistent point (sync/delta/points.py) has moved past where
it stood at every fault, and there the mirrored balances equal the ledger's. A runner
that exits on its own is started again, as its supervisor would, and its reason is
reported. The figures go to <home>/chaos.json.

Then, on what the faults left: the runner and `rebuild mirrors --verify` on a Spark
standalone cluster of two one-core workers, while the clients write again; the worker
running the rebuild's executor is killed mid-rebuild and started again. The rebuild from
offset zero (four partitions, the lake in a bucket) equals the live mirrors, and the
barrier and verify find every projection equal to Postgres. Its figures go to
<home>/chaos-cluster.json.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from decimal import Decimal

import psycopg
import pytest
from pyspark.sql import functions as F
from sqlalchemy import exc, text
from sqlalchemy.orm import Session

from projections.ledger import audit
from sync import config, lake
from sync.commands import snapshot
from sync.delta import reader
from sync.demo import bank
from sync.stack import Connect, Kafka, Postgres
from sync.stack.background import start_background, stop_background
from sync.stack.process import pid_alive, read_pid, wait_until
from sync.stack.spark_cluster import SparkCluster
from sync.streaming.offsets import end_offsets
from tests.chaos.conftest import LAKE
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.chaos

SEED = 20261122
KILLS = 5


class Workload(threading.Thread):
    """A client writing transactions over customers, orders and order_items until told
    to stop; it reconnects when Postgres goes away and counts what committed."""

    def __init__(self, settings, client: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.settings, self.client, self.stop_event = settings, client, stop
        self.random = random.Random(SEED + client)
        self.committed = self.rows = self.failed = 0

    def run(self):
        dsn = config.role_dsn(self.settings, config.ROLES["app"])
        conn = None
        while not self.stop_event.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=3)
                self.rows += self.transaction(conn)
                self.committed += 1
            except psycopg.OperationalError:
                self.failed += 1
                conn = None
                time.sleep(0.5)  # Postgres is restarting: retry, don't spin
            time.sleep(self.random.uniform(0.02, 0.2))  # pacing of a client, not a wait for a result

    def transaction(self, conn) -> int:
        r, base = self.random, 900000 + self.client * 50000
        customer = base + r.randrange(300)   # a small key space: updates and deletes hit live rows
        order = base + 10000 + r.randrange(2000)
        with conn.transaction():
            conn.execute("INSERT INTO customers (id, name, email, tier) VALUES (%s, %s, %s, %s) "
                         "ON CONFLICT (id) DO UPDATE SET tier = EXCLUDED.tier, updated_at = now()",
                         (customer, f"chaos {customer}", f"chaos{customer}@x", r.choice("abc")))
            conn.execute("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (%s, %s, 'new', now()) "
                         "ON CONFLICT (id) DO UPDATE SET status = 'changed', updated_at = now()", (order, customer))
            conn.execute("INSERT INTO order_items (order_id, line_no, product_id, qty, unit_price) "
                         "SELECT %s, %s, id, %s, price FROM products ORDER BY id LIMIT 1 "
                         "ON CONFLICT (order_id, line_no) DO UPDATE SET qty = EXCLUDED.qty",
                         (order, r.randrange(1, 4), r.randrange(1, 9)))
            if r.random() < 0.15:
                conn.execute("DELETE FROM order_items WHERE order_id = %s", (order,))
                conn.execute("DELETE FROM orders WHERE id = %s", (order,))
        return 3


class BankClient(Workload):
    """A bank client: transfers, deposits and withdrawals, each one transaction with its
    outbox events; it retries through Postgres restarts like the others."""

    ACCOUNTS = range(990100, 990110)

    def run(self):
        engine = bank.engine(config.role_dsn(self.settings, config.ROLES["app"]))
        while not self.stop_event.is_set():
            try:
                with Session(engine) as session, session.begin():
                    self.operation(session)
                self.committed += 1
            except bank.Refused:
                pass
            except exc.DBAPIError:
                self.failed += 1
                engine.dispose()  # connections to the old Postgres are gone
                time.sleep(0.5)  # Postgres is restarting: retry, don't spin
            time.sleep(self.random.uniform(0.02, 0.2))  # pacing of a client, not a wait for a result
        engine.dispose()

    def operation(self, session) -> None:
        r = self.random
        amount = Decimal(r.randint(1, 50_00)) / 100
        if r.random() < 0.8:
            bank.transfer(session, r.choice(self.ACCOUNTS), r.choice(self.ACCOUNTS), amount)
        else:
            bank.deposit(session, r.choice(self.ACCOUNTS), amount)
        self.rows += 2  # two postings

    @classmethod
    def open(cls, settings) -> None:
        engine = bank.engine(config.role_dsn(settings, config.ROLES["app"]))
        with Session(engine) as session, session.begin():
            bank.open_house_accounts(session)
            for account in cls.ACCOUNTS:
                session.execute(text("INSERT INTO customers (id, name, email) VALUES (:id, 'chaos bank', :email)"),
                                {"id": account, "email": f"bank{account}@x"})
                session.execute(text("INSERT INTO accounts (id, customer_id, currency) VALUES (:id, :id, 'EUR')"),
                                {"id": account})
                bank.deposit(session, account, Decimal("1000"))
        engine.dispose()


def restart_if_exited(settings, exits: list[str]) -> bool:
    """Start the runner again if it exited on its own (as its supervisor would), noting
    why in `exits`: its last error message, or its log's last lines."""
    if read_pid(settings.runner_pidfile) is not None:
        return False
    log = (settings.logs / "runner.log").read_text(errors="replace").splitlines()
    reasons = [line for line in log if line.startswith("lakesync run:")]
    exits.append(reasons[-1] if reasons else "\n".join(log[-10:]))
    start_background(settings)
    return True


def kill_runner(settings) -> None:
    pid = read_pid(settings.runner_pidfile)
    assert pid, "no runner to kill"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 30, f"the exit of the killed runner (pid {pid})")
    settings.runner_pidfile.unlink(missing_ok=True)


def restart(settings, service) -> None:
    service.stop()
    lakesync("up", check=True, timeout=300)


def consistent_place(settings) -> int | None:
    """Where the consistent point stands now (its place in commit order), if anywhere."""
    found = snapshot.published(settings)
    return found[-1].offset if found else None


def topic_partitions(settings) -> dict[str, int]:
    """Each of the stack's topics (without the prefix): its partitions."""
    prefix = f"{config.TOPIC_PREFIX}."
    return dict(sorted(Counter(topic.removeprefix(prefix)
                               for topic, _ in end_offsets(settings, re.escape(prefix) + ".*")).items()))


def test_chaos_loses_and_doubles_nothing(stack, app_db, synced, spark):
    app_db.execute("INSERT INTO products (id, sku, name, price) VALUES (990001, 'CHAOS', 'chaos', 9.99) "
                   "ON CONFLICT DO NOTHING")
    rng = random.Random(SEED)
    stop = threading.Event()
    BankClient.open(stack)
    clients = [Workload(stack, client, stop) for client in range(2)] + [BankClient(stack, 2, stop)]
    for client in clients:
        client.start()
    started = time.monotonic()
    faults = ["kill"] * KILLS + ["connect", "kafka", "postgres"]
    rng.shuffle(faults)
    done, exits = [], []  # the faults done; why the runner exited when nobody killed it
    points_at_faults = []  # where the consistent point stood when each fault struck
    for fault in faults:
        time.sleep(rng.uniform(3, 12))  # a random moment under load: that is the point
        points_at_faults.append(consistent_place(stack))
        if fault == "kill":
            restart_if_exited(stack, exits)
            kill_runner(stack)
            start_background(stack)
        else:
            service = {"connect": Connect, "kafka": Kafka, "postgres": Postgres}[fault](stack)
            restart(stack, service)
            if restart_if_exited(stack, exits):  # the runner may not survive a broker restart
                done.append("runner restarted after " + fault)
        done.append(fault)
    time.sleep(5)  # some writes after the last fault, then the barrier below decides
    stop.set()
    for client in clients:
        client.join(timeout=30)
    restart_if_exited(stack, exits)
    reports = synced(timeout=600)  # the backlog after the last fault: minutes on 2 cores
    point = snapshot.latest(stack)
    tables = snapshot.dataframes(spark, stack, point)
    mirrored = tables["mirror.accounts"].select(F.col("id").alias("account"), F.col("balance").alias("mirrored"))
    unequal = tables["ledger.balances"].join(mirrored, "account").where("balance <> mirrored").count()
    unbalanced = audit.unbalanced_operations([r.asDict() for r in tables["ledger"].collect()])
    figures = {
        "transactions_committed": sum(c.committed for c in clients),
        "bank_operations_committed": clients[-1].committed,
        "rows_written": sum(c.rows for c in clients),
        "client_errors_during_restarts": sum(c.failed for c in clients),
        "runner_kills": done.count("kill"),
        "restarts": [f for f in done if f != "kill"],
        "runner_exits_on_its_own": exits,
        "seconds": round(time.monotonic() - started, 1),
        "differences": sum(r.differences for r in reports.values()),
        "tables_compared": len(reports),
        "consistent_point_at_faults": points_at_faults,
        "consistent_point_at_end": point.offset,
        "partitions": topic_partitions(stack),
        "lake": str(stack.lake),
    }
    (stack.home / "chaos.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    assert figures["runner_kills"] == KILLS and {"connect", "kafka", "postgres"} <= set(figures["restarts"])
    assert figures["transactions_committed"] > 0 and figures["bank_operations_committed"] > 0
    assert figures["differences"] == 0 and {"ledger", "ledger.balances"} <= set(reports)
    assert all(at is None or point.offset > at for at in points_at_faults), "the consistent point did not move on"
    assert unequal == 0 and unbalanced == [], f"at the consistent point: {unequal} balances differ, {unbalanced[:3]}"
    # The changes came through four partitions per topic, in commit order through one.
    assert {figures["partitions"][t] for t in ("public.accounts", "public.orders", "events.account")} == {4}
    assert figures["partitions"]["transaction"] == 1
    # Every table the point names is in the bucket (tests/chaos/conftest.py), none on the disk.
    assert stack.lake == lake.at(LAKE) and all(t["path"].startswith(f"{LAKE}/") for t in point.tables.values())
    assert not (stack.home / "lake").exists()
    # A reader outside Hadoop reads a table of the point by the name `snapshot --json` gives it.
    accounts = json.loads(lakesync("snapshot", "--json", check=True).stdout)["tables"]["mirror.accounts"]
    assert accounts["reader_path"] == f"s3://{accounts['path'][len('s3a://'):]}"
    duck = reader.connect()
    assert reader.scan(duck, accounts["path"]) == accounts["reader_path"]  # (and the bucket's secret made)
    assert duck.execute("SELECT count(*) FROM delta_scan(?, version => ?)",
                        [accounts["reader_path"], accounts["version"]]).fetchone()[0] == (
        spark.read.format("delta").option("versionAsOf", accounts["version"]).load(accounts["path"]).count())
    duck.close()


def test_on_a_cluster_that_loses_a_worker_a_rebuild_equals_the_live_mirrors_and_both_postgres(stack, synced,
                                                                                                monkeypatch):
    assert stop_background(stack, timeout=120), "the chaos run's runner is not running"
    monkeypatch.setenv("LAKESYNC_SPARK_WORKERS", "2")  # for `up`, the runner, the rebuild, the barrier
    settings = config.load()
    cluster = SparkCluster(settings)
    started = time.monotonic()
    stop = threading.Event()
    clients = [Workload(stack, client, stop) for client in (3, 4)] + [BankClient(stack, 5, stop)]
    try:
        lakesync("up", check=True, timeout=300)  # the cluster beside the stack
        start_background(settings)  # all cores but one: one worker's executor
        wait_until(lambda: len(executors(settings)) == 1, 180, "the runner's executor")
        for client in clients:
            client.start()
        log = stack.home / "chaos-rebuild.log"
        with open(log, "w") as output:
            rebuild = subprocess.Popen([sys.executable, "-m", "sync", "rebuild", "mirrors", "--verify"],
                                       stdout=output, stderr=subprocess.STDOUT)
        wait_until(lambda: len(executors(settings)) == 2 or rebuild.poll() is not None, 180,
                   "the rebuild's executor")
        application, (worker, _) = max(executors(settings).items())  # the newest: the rebuild's

        def logs():  # (read again: its executor's folder may not be there yet)
            return executors(settings)[application][1]
        wait_until(lambda: tasks_run(logs()) > 20 or rebuild.poll() is not None, 300, "tasks of the rebuild")
        assert rebuild.poll() is None, f"the rebuild ended before its worker was killed:\n{log.read_text()}"
        os.killpg(read_pid(cluster.pidfile(worker)), signal.SIGKILL)  # its executor too
        wait_until(lambda: cluster.workers_running() == 1, 10, "the killed worker gone")
        lakesync("up", check=True, timeout=300)  # starts it again; the rebuild gets an executor there
        stop.set()
        for client in clients:
            client.join(timeout=30)
        rebuild.wait(timeout=1200)
        output = log.read_text()
        reports = synced(timeout=600)
        figures = {"seconds": round(time.monotonic() - started, 1), "killed": f"{worker} ({application})",
                   "tasks_run": tasks_run(logs()), "rebuild_exit": rebuild.returncode,
                   "replays": [line.strip() for line in output.splitlines() if "lost an executor" in line],
                   "transactions_committed": sum(c.committed for c in clients),
                   "differences": sum(r.differences for r in reports.values()), "tables_compared": len(reports)}
        (stack.home / "chaos-cluster.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures, indent=2))
        assert rebuild.returncode == 0 and "verify: the rebuilt projection is identical" in output, output
        assert figures["transactions_committed"] > 0 and figures["differences"] == 0
        assert cluster.workers_running() == 2 and read_pid(settings.runner_pidfile) is not None
    finally:
        stop.set()
        stop_background(settings, timeout=120)
        cluster.stop()


def executors(settings) -> dict[str, tuple[str, list]]:
    """Per application that has an executor on the cluster: its worker and the executor's logs."""
    found = {}
    for folder in (settings.home / "spark").glob("worker-*"):
        for application in folder.glob("app-*"):
            found[application.name] = (folder.name, list(application.glob("*/stderr")))
    return found


def tasks_run(logs) -> int:
    return sum(log.read_text(errors="replace").count("Running task") for log in logs)
