"""Source-side fault: the replication slot lost while the connector is down.

The changes made meanwhile never reach the log. Lakesync must say so (wait fails at
once, status names the cause), never resume silently past the gap, and the documented
recovery, `lakesync resnapshot`, must bring every mirror back to Postgres.
"""

import json
import time

import psycopg
import pytest

from sync.config import CONNECTOR_NAME, SLOT
from sync.stack.background import start_background
from sync.stack.connect import connector_status, rest
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


def test_a_lost_slot_is_reported_and_a_resnapshot_heals_the_mirrors(db, app_db, stack, synced):
    app_db.execute("INSERT INTO customers (id, name, email, tier) SELECT g, 'slot', 'slot' || g, 'a' "
                   "FROM generate_series(970000, 970009) g")
    synced("customers")
    rest(stack, "PUT", f"/connectors/{CONNECTOR_NAME}/stop")
    _until(lambda: connector_status(stack)["connector"]["state"] == "STOPPED")
    # While capture is down, and then the slot goes: these changes never reach Kafka.
    app_db.execute("UPDATE customers SET tier = 'lost update' WHERE id BETWEEN 970000 AND 970004")
    app_db.execute("DELETE FROM customers WHERE id BETWEEN 970005 AND 970009")
    app_db.execute("INSERT INTO customers (id, name, email, tier) SELECT g, 'slot', 'slot' || g, 'lost insert' "
                   "FROM generate_series(970010, 970014) g")
    _until(lambda: _drop_slot(db))
    rest(stack, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")

    waited = lakesync("wait", "--timeout", "120")
    assert waited.returncode == 1 and "capture is broken" in waited.stderr, waited.stderr
    assert f"replication slot {SLOT} does not exist" in waited.stderr
    status = lakesync("status", "--json")
    assert status.returncode == 1
    assert json.loads(status.stdout)["components"]["slot"]["ok"] is False

    healed = lakesync("resnapshot", timeout=600)
    assert healed.returncode == 0, healed.stdout + healed.stderr
    start_background(stack)
    app_db.execute("UPDATE customers SET name = 'after the resnapshot' WHERE id = 970010")
    reports = synced(timeout=900)  # every mirror rebuilds from the new snapshot (minutes here)
    assert reports["mirror.customers"].differences == 0
    assert lakesync("status").returncode == 0


def _drop_slot(db) -> bool:
    try:
        db.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        return True
    except psycopg.errors.ObjectInUse:  # the stopped task's connection is still closing
        return False


def _until(check, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)  # the polling interval of a condition with a deadline, not a wait for a result
