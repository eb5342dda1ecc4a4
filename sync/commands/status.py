"""`lakesync status`: is each component healthy, and how far behind is each projection."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

from sync import search
from sync.cdc.transactions import Held, held_after
from sync.commands import all_projections, snapshot
from sync.commands.capture import snapshots
from sync.commands.freshness import lags
from sync.config import Settings, safe_dsn
from sync.delta import catalog
from sync.errors import LakesyncError
from sync.projection import Target
from sync.stack import capture
from sync.stack.connect import connector_status, source_offset
from sync.stack.kafka import kafka_ready
from sync.stack.postgres import pg_connect
from sync.stack.process import port_open, read_pid
from sync.stack.spark_cluster import SparkCluster
from sync.streaming import progress
from sync.streaming.offsets import last_batch


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat() if ts else None


def collect(settings: Settings) -> dict[str, Any]:
    components: dict[str, Any] = {}
    slot_lag = None
    # With Postgres at hand every captured table is listed, a mirror that could not even
    # be created (stopped) included; without it, what the lake holds.
    targets: dict[str, list[Target]] = {}
    try:
        with pg_connect(settings) as conn:
            slot = capture.slot_state(conn)
            targets = {p.name: p.verify_targets(settings, conn) for p in all_projections(settings)}
        # WAL the slot makes Postgres keep (restart_lsn); what is not yet confirmed is lag_bytes.
        slot_lag = slot.get("retained_bytes")
        components["postgres"] = {"ok": True, "dsn": safe_dsn(settings.pg_dsn)}
        components["slot"] = slot
    except LakesyncError as error:
        components["postgres"] = {"ok": False, "dsn": safe_dsn(settings.pg_dsn), "error": str(error)}

    kafka_ok = kafka_ready(settings.kafka_bootstrap, timeout=3)
    components["kafka"] = {"ok": kafka_ok, "bootstrap": settings.kafka_bootstrap}

    try:
        status = connector_status(settings)
        tasks = [{"id": t["id"], "state": t["state"],
                  **({"error": (t.get("trace") or "").strip().split("\n")[0][:400]} if t["state"] == "FAILED" else {})}
                 for t in status.get("tasks", [])]
        ok = status["connector"]["state"] == "RUNNING" and bool(tasks) and all(t["state"] == "RUNNING" for t in tasks)
        components["connect"] = {"ok": ok, "url": settings.connect_url, "connector": status["connector"]["state"],
                                 "tasks": tasks,
                                 # The tables `capture add` asked to snapshot: requested, running, done.
                                 "snapshots": snapshots(settings, source_offset(settings))}
    except LakesyncError as error:
        components["connect"] = {"ok": False, "url": settings.connect_url, "tasks": [], "error": str(error)}

    if settings.search_url:
        components["search"] = {"ok": search.healthy(settings.search_url), "url": settings.search_url}

    if settings.spark_workers:
        cluster = SparkCluster(settings)
        workers = cluster.workers_running()
        components["spark"] = {"ok": port_open("127.0.0.1", settings.spark_master_port)
                               and workers >= settings.spark_workers, "url": cluster.url,
                               "workers": workers, "workers_wanted": settings.spark_workers}

    pid = read_pid(settings.runner_pidfile)
    components["runner"] = {"ok": pid is not None, "pid": pid}

    behind: dict[str, dict[str, int]] = {}
    if kafka_ok:
        for lag in lags(settings):
            for (topic, partition), high in lag.end.items():
                per_topic = behind.setdefault(lag.projection, {})
                per_topic[topic] = per_topic.get(topic, 0) + max(0, high - lag.processed.get((topic, partition), 0))

    projections = []
    for projection in all_projections(settings):
        state = progress.read(settings, projection.name)
        for target in targets[projection.name] if targets else projection.targets(settings):
            table_state = state.get("tables", {}).get(target.state_key, {})
            topic_lag = behind.get(projection.name, {})
            projections.append({
                "name": target.name, "kind": target.kind, "table": target.table,
                "lag": projection.lag_of(target, topic_lag) if kafka_ok else None,
                "last_batch_at": _iso(table_state.get("last_batch_at")),
                "last_batch_rows": table_state.get("last_batch_rows"),
                "last_batch_seconds": state.get("last_batch_seconds"),
                "last_batch_steps": state.get("last_batch_steps"),  # where a batch's time went (mirrors, views)
                "rows_applied": table_state.get("rows_applied", 0),
                "dead_letters": table_state.get("dead_letters", 0),
                # event time: events beyond the allowed lateness, kept in the late table
                "late_events": table_state.get("late_events", 0),
                "watermarks": state.get("watermarks"),
                "stopped": table_state.get("stopped"),
            })
    # The source transactions held until all their changes are read (sync/cdc/transactions.py).
    held = {}
    for name in snapshot.PUBLISHERS:
        checkpoint = catalog.checkpoint(settings, name)
        last = last_batch(checkpoint)
        held[name] = held_after(checkpoint, last) if last is not None else Held()
    found = snapshot.published(settings) if settings.whole_transactions else []
    transactions = {"whole": settings.whole_transactions,
                    "held": len(set().union(*(h.xids for h in held.values()))),
                    "oldest_held": next((h.oldest() for h in held.values() if h.xids), None),
                    "held_by": {name: len(h.xids) for name, h in held.items()},
                    # the consistent point `lakesync snapshot` prints, without its tables
                    "point": {k: v for k, v in asdict(found[-1]).items() if k not in ("tables", "first", "inputs")}
                    if found else None}
    return {"components": components, "slot_lag_bytes": slot_lag, "projections": projections,
            "transactions": transactions}


def healthy(report: dict[str, Any]) -> bool:
    """Every component up and no mirror stopped by an incompatible schema change."""
    return (all(c["ok"] for c in report["components"].values())
            and not any(p.get("stopped") for p in report["projections"]))


def render(report: dict[str, Any]) -> str:
    lines = ["component  ok    detail"]
    for name, c in report["components"].items():
        failed = [t.get("error") for t in c.get("tasks", []) if t.get("error")]
        running = {t: s["state"] + (f" (key {s['at_key']} of {s['last_key']})" if "at_key" in s else "")
                   for t, s in c.get("snapshots", {}).items() if s["state"] != "done"}
        if name == "slot":
            usual = f"{c['name']}, wal_status {c.get('wal_status')}, {c.get('retained_bytes')} bytes retained"
        elif name == "connect":
            usual = f"connector {c.get('connector')}, tasks {[t['state'] for t in c.get('tasks', [])]}" + (
                "; snapshot " + ", ".join(f"{t} {s}" for t, s in running.items()) if running else "")
        elif name == "spark":
            usual = f"master {c['url']}, {c['workers']} of {c['workers_wanted']} workers running"
        elif name == "runner":
            usual = f"pid {c.get('pid')}"
        else:
            usual = c.get("dsn") or c.get("bootstrap") or c.get("url")
        detail = c.get("error") or (failed[0] if failed else None) or usual
        lines.append(f"{name:<10} {'yes' if c['ok'] else 'NO':<5} {detail}")
    lag = report["slot_lag_bytes"]
    lines.append(f"replication slot lag: {lag if lag is not None else '?'} bytes")
    transactions = report["transactions"]
    if not transactions["whole"]:
        lines.append("the mirrors, the changelog and the ledger apply each change as read "
                     "(LAKESYNC_WHOLE_TRANSACTIONS=off)")
    else:
        point = transactions["point"]
        lines.append(f"consistent point (lakesync snapshot): mirrors' batch {point['batch']}, source commit of "
                     f"{point['committed_at'] or '-'}, published {point['published_at']}" if point
                     else "consistent point: none yet")
        if transactions["held"]:
            by = ", ".join(f"{name} {n}" for name, n in transactions["held_by"].items() if n)
            lines.append(f"source transactions held until whole: {transactions['held']} ({by}; "
                         f"oldest: xid {transactions['oldest_held']})")
    lines.append("")
    lines.append(f"{'projection':<28} {'kind':<9} {'lag':>6} {'rows applied':>13} {'dead letters':>12}  "
                 f"{'last batch (UTC)':<26} table")
    for p in report["projections"]:
        lines.append(f"{p['name']:<28} {p['kind']:<9} {str(p['lag']):>6} {p['rows_applied']:>13} "
                     f"{p['dead_letters']:>12}  {(p['last_batch_at'] or '-')[:26]:<26} {p['table']}")
        if p.get("late_events"):
            marks = ", ".join(f"{stream} {mark}" for stream, mark in (p.get("watermarks") or {}).items())
            lines.append(f"    late events: {p['late_events']} (beyond the allowed lateness); watermarks: {marks}")
        if p.get("stopped"):
            lines.append(f"    STOPPED: {p['stopped']}")
    return "\n".join(lines)
