"""Is change capture intact? The replication slot and the connector's tasks.

A slot dropped, or invalidated by Postgres (max_slot_wal_keep_size), while the
connector was down means changes were lost for good. Debezium 3.x refuses to resume
past such a gap (its task fails: "...no longer available on the server"); Lakesync
reports it in `status` and fails `wait` at once, naming the cause, and never resumes
silently. The recovery is a fresh snapshot: `lakesync resnapshot` (sync/commands/resnapshot.py).
"""

from __future__ import annotations

from typing import Any

from sync.cdc.ordering import parse_lsn
from sync.config import HEARTBEAT_TABLE, SLOT, Settings
from sync.errors import LakesyncError
from sync.stack.connect import connector_status
from sync.stack.postgres import pg_connect

# Rows of the heartbeat table besides the connector's own (row 1, its action query). A touch
# is a captured change: a source transaction, which starts a batch of every Kafka-fed query.
BARRIER_ROW = 2  # `lakesync wait`: a change after the position it waits for
NEXT_BATCH_ROW = 3  # a batch that held whole transactions to stand with others: the batch after it


def touch_heartbeat(settings: Settings, row: int) -> int:
    """Touch heartbeat row `row`; returns the WAL position just before the touch."""
    with pg_connect(settings, autocommit=True) as conn:
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        conn.execute(f"INSERT INTO {HEARTBEAT_TABLE} (id, beat_at) VALUES (%s, clock_timestamp()) "
                     "ON CONFLICT (id) DO UPDATE SET beat_at = EXCLUDED.beat_at", (row,))
    return parse_lsn(lsn)


def slot_state(conn) -> dict[str, Any]:
    """The replication slot as Postgres sees it (`lost` = invalidated, WAL gone)."""
    row = conn.execute(
        "SELECT wal_status, active, (pg_current_wal_lsn() - restart_lsn)::bigint, "
        "(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    if row is None:
        return {"ok": False, "name": SLOT, "exists": False,
                "error": f"replication slot {SLOT} does not exist: changes made since it went are lost; "
                         "run `lakesync resnapshot`"}
    wal_status, active, retained, lag = row
    state = {"ok": wal_status != "lost", "name": SLOT, "exists": True, "wal_status": wal_status,
             "active": active, "retained_bytes": retained, "lag_bytes": lag}
    if wal_status == "lost":
        state["error"] = (f"replication slot {SLOT} was invalidated (the WAL it needed is gone): "
                          "changes were lost; run `lakesync resnapshot`")
    return state


def failed_tasks(settings: Settings) -> list[str]:
    """'task N: first line of its error' for every FAILED connector task."""
    status = connector_status(settings)
    failed = []
    for task in status.get("tasks", []):
        if task.get("state") == "FAILED":
            trace = (task.get("trace") or "no trace").strip().splitlines()
            failed.append(f"task {task['id']}: {trace[0][:400]}")
    return failed


def problems(settings: Settings, conn) -> list[str]:
    """Why capture cannot go on, if it cannot (empty when it can)."""
    found = []
    slot = slot_state(conn)
    if not slot["ok"]:
        found.append(slot["error"])
    try:
        found.extend(f"Debezium {failure}" for failure in failed_tasks(settings))
    except LakesyncError as error:
        found.append(str(error))
    return found
