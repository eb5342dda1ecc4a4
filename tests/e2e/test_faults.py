"""Effectively-once under faults (the crash table in sync/delta/commit.py): crash points,
a zombie runner, and concurrent projections that never mix up their transaction ids.

Each test stops the session's runner, runs runners with LAKESYNC_FAULT set under a
workload until the fault fires, restarts a healthy runner, and ends with the barrier
and verify: every mirror equals Postgres, no key is held twice, and the changelog holds
each Kafka record exactly once.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from projections import changelog, mirrors
from sync.delta import fencing
from sync.delta.fencing import latest_epoch
from sync.stack.background import start_background, stop_background
from tests.e2e.conftest import lakesync, start_runner

pytestmark = pytest.mark.e2e

CRASHED = 137


def order_with_lines(db, order_id, customer_id, lines=3):
    """One transaction over three tables: a customer, an order and its lines."""
    with db.transaction():
        db.execute("INSERT INTO customers (id, name, email, tier) VALUES (%s, %s, %s, 'bronze') "
                   "ON CONFLICT (id) DO UPDATE SET tier = 'silver', updated_at = now()",
                   (customer_id, f"c{customer_id}", f"c{customer_id}@faults"))
        db.execute("INSERT INTO orders (id, customer_id, status, placed_at) VALUES (%s, %s, 'new', now())",
                   (order_id, customer_id))
        for line in range(1, lines + 1):
            db.execute("INSERT INTO order_items (order_id, line_no, product_id, qty, unit_price) "
                       "SELECT %s, %s, id, %s, price FROM products ORDER BY id LIMIT 1", (order_id, line, line))
        db.execute("UPDATE orders SET status = 'paid', updated_at = now() WHERE id = %s", (order_id - 1,))
        db.execute("DELETE FROM order_items WHERE order_id = %s AND line_no = 1", (order_id - 1,))


def write_until_exit(db, process, base, timeout=300):
    """Keep writing multi-table transactions until `process` exits; returns its code."""
    deadline = time.monotonic() + timeout
    n = 0
    while process.poll() is None:
        assert time.monotonic() < deadline, f"the fault never fired:\n{process.log.read_text()[-3000:]}"
        order_with_lines(db, base + n, base + n // 3)
        n += 1
        time.sleep(0.3)  # paces the writes until the fault fires; the result is checked by the barrier
    return process.returncode


@pytest.fixture
def products(app_db):
    app_db.execute("INSERT INTO products (id, sku, name, price) VALUES (880001, 'FAULT-1', 'fault', 2.50) "
                   "ON CONFLICT DO NOTHING")


POINTS = {"before_delta_commit": 810000, "after_delta_commit": 820000, "between_tables": 830000}


def test_a_crash_at_each_point_loses_and_doubles_nothing(stack, app_db, products, synced):
    """One crash at each point in turn, each restart resuming from what the crash before
    left, then one barrier and verify over all of them: a loss or a double at any point
    shows in the end state (the chaos test kills at random moments as well)."""
    stop_background(stack)
    for point, base in POINTS.items():
        faulty = start_runner(stack, point)
        assert write_until_exit(app_db, faulty, base) == CRASHED, point
        assert f"LAKESYNC_FAULT: crashing at {point}" in faulty.log.read_text(), point
        order_with_lines(app_db, base + 5000, base + 5000)  # written while nothing runs
    start_background(stack)
    reports = synced("customers", "orders", "order_items", "changelog")  # what the workload writes
    assert reports["mirror.order_items"].target_rows > 0 and reports["changelog"].differences == 0


def test_a_zombie_runner_is_fenced(stack, app_db, products, synced):
    """A runner frozen mid-batch (a GC pause, a stopped VM) is taken for dead; a new run
    starts. When the old one wakes up it must not commit."""
    stop_background(stack)
    zombie = start_runner(stack, "pause_before_delta_commit")
    n, deadline = 0, time.monotonic() + 300
    while _state(zombie.pid) != "T":
        assert time.monotonic() < deadline, f"the runner never paused:\n{zombie.log.read_text()[-3000:]}"
        order_with_lines(app_db, 840000 + n, 840000 + n)
        n += 1
        time.sleep(0.3)  # paces the writes until the runner pauses; the result is checked by the barrier
    stack.runner_pidfile.unlink()  # what an operator does with a runner they think is dead
    start_background(stack)
    order_with_lines(app_db, 845000, 845000)
    lakesync("wait", "--timeout", "600", check=True)
    os.kill(zombie.pid, signal.SIGCONT)
    assert zombie.wait(timeout=180) != 0
    output = zombie.log.read_text()
    # Refused by our fence, by Delta's conflict check against the newer run's epoch stamp
    # (a write stopped past the fence's check: sync/delta/commit.py's crash table), or by
    # Spark's own guard on the shared checkpoint: either way the zombie stops, and below,
    # the tables show it committed nothing once the newer run began.
    assert ("fenced, a newer run holds epoch" in output
            or ("DELTA_METADATA_CHANGED" in output and "lakesync.epoch" in output)
            or "Multiple streaming jobs detected" in output), output[-3000:]
    newer = latest_epoch(fencing.registry(stack, "mirrors"))
    for table in (mirrors.mirror_path(stack, "orders"), mirrors.mirror_path(stack, "order_items"),
                  Path(changelog.changelog_path(stack))):
        epochs = [_epoch(commit) for commit in sorted(Path(table, "_delta_log").glob("*.json"))]
        epochs = [e for e in epochs if e is not None]
        if newer in epochs:
            assert all(e >= newer for e in epochs[epochs.index(newer):]), f"{table}: zombie commit in {epochs}"
    synced("customers", "orders", "order_items", "changelog")


def test_concurrent_projections_commit_with_their_own_transaction_ids(stack, app_db, synced):
    """Two queries in one driver: every data commit carries its own projection's txnAppId,
    and its app id in userMetadata; the tombstones, appended at least once, the latter only."""
    app_db.execute("INSERT INTO customers (id, name, email, tier) SELECT g, 'x', 'txn' || g, 'gold' "
                   "FROM generate_series(850000, 850049) g")
    app_db.execute("DELETE FROM customers WHERE id BETWEEN 850000 AND 850009")
    synced("customers", "changelog")
    expected = {str(mirrors.mirror_path(stack, "customers")): "mirrors:customers",
                str(mirrors.tombstone_path(stack, "customers")): "mirrors:customers:tombstones",
                changelog.changelog_path(stack): "changelog"}
    for table, app_id in expected.items():
        data_commits = 0
        for commit in sorted(Path(table, "_delta_log").glob("*.json")):
            actions = [json.loads(line) for line in commit.read_text().splitlines()]
            info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
            if info["operation"] in ("MERGE", "WRITE"):
                txns = [a["txn"]["appId"] for a in actions if "txn" in a]
                expected_txns = [] if app_id.endswith(":tombstones") else [app_id]
                assert txns == expected_txns, f"{commit}: {info['operation']} with {txns}, expected {expected_txns}"
                assert json.loads(info["userMetadata"])["app_id"] == app_id, f"{commit}: {info['userMetadata']}"
                data_commits += 1
        assert data_commits > 0, f"no data commit in {table}"


def _epoch(commit):
    """The epoch in a data commit's userMetadata (sync/delta/commit.py), else None."""
    for line in commit.read_text().splitlines():
        info = json.loads(line).get("commitInfo")
        if info and info.get("userMetadata"):
            return json.loads(info["userMetadata"])["epoch"]
    return None


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
