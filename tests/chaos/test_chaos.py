"""The chaos run: faults at random moments under a concurrent workload, then the oracle.

While two clients keep writing multi-table transactions, the runner is killed with
SIGKILL five times at random moments (restarted each time), and the Connect worker, the
Kafka broker and Postgres are each restarted once. At the end the barrier and verify
must show every mirror equal to Postgres, no key held twice, and the changelog holding
every record once: nothing lost, nothing doubled. The figures go to <home>/chaos.json.
"""

import json
import os
import random
import signal
import threading
import time

import psycopg
import pytest

from sync import config
from sync.runner import start_background
from sync.stack import Connect, Kafka, Postgres
from sync.stack.process import pid_alive, read_pid, wait_until
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


def kill_runner(settings) -> None:
    pid = read_pid(settings.runner_pidfile)
    assert pid, "no runner to kill"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 30, f"the exit of the killed runner (pid {pid})")
    settings.runner_pidfile.unlink(missing_ok=True)


def restart(settings, service) -> None:
    service.stop()
    lakesync("up", check=True, timeout=300)


def test_chaos_loses_and_doubles_nothing(stack, app_db, synced):
    app_db.execute("INSERT INTO products (id, sku, name, price) VALUES (990001, 'CHAOS', 'chaos', 9.99) "
                   "ON CONFLICT DO NOTHING")
    rng = random.Random(SEED)
    stop = threading.Event()
    clients = [Workload(stack, client, stop) for client in range(2)]
    for client in clients:
        client.start()
    started = time.monotonic()
    faults = ["kill"] * KILLS + ["connect", "kafka", "postgres"]
    rng.shuffle(faults)
    done = []
    for fault in faults:
        time.sleep(rng.uniform(3, 12))  # a random moment under load: that is the point
        if fault == "kill":
            kill_runner(stack)
            start_background(stack)
        else:
            service = {"connect": Connect, "kafka": Kafka, "postgres": Postgres}[fault](stack)
            restart(stack, service)
            if read_pid(stack.runner_pidfile) is None:  # the runner may not survive a broker restart
                start_background(stack)
                done.append("runner restarted after " + fault)
        done.append(fault)
    time.sleep(5)  # some writes after the last fault, then the barrier below decides
    stop.set()
    for client in clients:
        client.join(timeout=30)
    start_background(stack)
    reports = synced()
    figures = {
        "transactions_committed": sum(c.committed for c in clients),
        "rows_written": sum(c.rows for c in clients),
        "client_errors_during_restarts": sum(c.failed for c in clients),
        "runner_kills": done.count("kill"),
        "restarts": [f for f in done if f != "kill"],
        "seconds": round(time.monotonic() - started, 1),
        "differences": sum(r.differences for r in reports.values()),
        "tables_compared": len(reports),
    }
    (stack.home / "chaos.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    assert figures["runner_kills"] == KILLS and {"connect", "kafka", "postgres"} <= set(figures["restarts"])
    assert figures["transactions_committed"] > 0 and figures["differences"] == 0
