"""`lakesync run --once` (availableNow): stop the live runner, catch up in one go, resume.

Runs after the other end-to-end files: it stops the session's runner and starts it
again at the end, so the checkpoint is also shown to resume where it stopped.
"""

import pytest

from sync.stack.background import start_background, stop_background
from tests.e2e.conftest import lakesync

pytestmark = pytest.mark.e2e


def test_run_once_processes_what_is_there_and_exits(stack, app_db, synced):
    assert stop_background(stack, timeout=60), "the session's runner is not running"

    app_db.execute("INSERT INTO products (id, sku, name, price) SELECT g, 'ONCE-' || g, 'once', g "
                   "FROM generate_series(7000, 7099) g")
    app_db.execute("UPDATE products SET price = price + 0.01 WHERE id BETWEEN 7000 AND 7009")
    behind = lakesync("wait", "--timeout", "10")
    assert behind.returncode == 1 and "mirrors" in behind.stderr and "no runner is running" in behind.stderr

    again = lakesync("run", "--once", timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    lakesync("wait", "--timeout", "10", check=True)  # nothing left: --once caught up

    start_background(stack)
    app_db.execute("UPDATE products SET name = 'resumed' WHERE id = 7050")
    synced("products")
