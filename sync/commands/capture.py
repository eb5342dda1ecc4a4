"""`lakesync capture add|remove|list`: the capture set, changed while everything runs.

LAKESYNC_CAPTURE names what is captured from the start; `capture add` adds entries (a
schema, or schema.PATTERN) and keeps them in <home>/capture.json, which every command and
the runner read with the setting (sync/config.py). A table that exists when its entry is
added is snapshotted alone, by Debezium's incremental snapshot: the other tables get no
second snapshot. Steps of `add`, in order:
  1. Find the tables the new entries capture that the capture set did not (each schema
     must exist: one line, and nothing changed).
  2. Stop the connector (Connect's PUT .../stop), so no task reads the signal of step 5
     with the old include list (it would skip the tables it does not capture).
  3. Record the entries in <home>/capture.json (with the snapshot asked for).
  4. The capture set into the database (sync/stack/migrate.py `publish`: publication,
     grants, replica identity).
  5. Insert an `execute-snapshot` signal for those tables into the signal table; the WAL
     keeps it until the connector reads it.
  6. The connector's config with the new include list, resume it, wait until it streams:
     it reads the signal, then snapshots the tables in chunks beside the stream (rows as
     op r, each chunk deduplicated against the changes streamed meanwhile).
The tables stay `requested` in <home>/capture.json until step 6 is done: after a crash
anywhere, `capture add` again finishes it (it asks for their snapshot again and resumes
the connector). `remove` takes an added entry out (the setting's are changed where they
are set): its tables are no longer captured, and their mirrors stay as they were. `list` shows each entry, where it comes from and the tables it
captures, and the snapshots asked for with their progress (also in `status`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import replace

from projections.mirrors import mirror_name, table_keys
from sync.cdc.ordering import parse_lsn
from sync.config import CONNECTOR_NAME, SIGNAL_TABLE, CaptureSet, Settings, parse_capture
from sync.errors import LakesyncError
from sync.files import read_json, write_json_atomically
from sync.stack.connect import Connect, connector_status, offset_lsn, rest, wait_for_state
from sync.stack.migrate import publish, schema_owners
from sync.stack.postgres import pg_connect


def add(settings: Settings, entries: list[str], say=print) -> list[str]:
    """Steps 1-6 above; returns the tables (schema.table) asked to be snapshotted."""
    wanted = parse_capture(",".join(entries))
    new_entries = [e for e in wanted.texts() if e not in settings.capture.texts()]
    updated = replace(settings, capture=settings.capture.plus(wanted),
                      capture_added=settings.capture_added + tuple(new_entries))
    kept = read_json(settings.capture_file, {}) or {}
    asked = kept.get("snapshots", {})
    with pg_connect(settings) as conn:
        schema_owners(conn, updated)  # before anything changes: a schema that does not exist
        tables = table_keys(conn, updated.capture.schemas)
    fresh = set(_captured(tables, updated.capture)) - set(_captured(tables, settings.capture))
    to_snapshot = sorted(fresh | {t for t, info in asked.items() if info["state"] == "requested"})
    stopped = connector_status(settings)["connector"]["state"] == "STOPPED"  # by a crash in step 2-6
    if not new_entries and not to_snapshot and not stopped:
        say(f"  already captured: {', '.join(wanted.texts())}")
        return []

    def save(state: str, **more) -> None:
        asked.update({table: {**asked.get(table, {}), "state": state, **more} for table in to_snapshot})
        write_json_atomically(settings.capture_file, {**kept, "added": list(updated.capture_added), "snapshots": asked})

    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/stop")
    wait_for_state(settings, "STOPPED")
    say("  connector            stopped")
    save("requested")
    publish(updated)
    if to_snapshot:
        save("requested", signal_lsn=signal(updated, to_snapshot))
        say(f"  snapshot asked for   {', '.join(to_snapshot)}")
    connect = Connect(updated)
    connect.configure()
    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
    connect.wait_streaming()
    # Only now: a crash before leaves them requested, and `capture add` again resumes the
    # connector (a signal sent twice snapshots a table twice; its mirror is the same).
    save("signalled")
    say(f"  connector            streaming; captured: {updated.capture}")
    return to_snapshot


def remove(settings: Settings, entries: list[str], say=print) -> None:
    """Take added entries out of the capture set: their tables are captured no more, and
    their mirrors stay as they are. An entry of LAKESYNC_CAPTURE is changed there."""
    gone = parse_capture(",".join(entries)).texts()
    named = [e for e in gone if e in settings.capture.texts() and e not in settings.capture_added]
    if named:
        raise LakesyncError(f"{', '.join(named)}: named by LAKESYNC_CAPTURE, so removed there")
    kept = tuple(e for e in settings.capture_added if e not in gone)
    if kept == settings.capture_added:
        say(f"  not captured by `capture add`: {', '.join(gone)}")
        return
    base = [e for e in settings.capture.texts() if e not in settings.capture_added]
    updated = replace(settings, capture=parse_capture(",".join(base + list(kept))), capture_added=kept)
    write_json_atomically(settings.capture_file, {**(read_json(settings.capture_file, {}) or {}), "added": list(kept)})
    publish(updated)
    Connect(updated).register()
    say(f"  captured: {updated.capture}")


def listing(settings: Settings) -> list[dict]:
    """Each entry: where it comes from and the tables it captures now (mirror names)."""
    with pg_connect(settings) as conn:
        tables = table_keys(conn, settings.capture.schemas)
    return [{"entry": entry, "from": "capture add" if entry in settings.capture_added else "LAKESYNC_CAPTURE",
             "mirrors": sorted(f"mirror.{mirror_name(schema, table)}" for schema, table, _ in tables
                               if parse_capture(entry).captures(schema, table))}
            for entry in settings.capture.texts()]


def snapshots(settings: Settings, offset: dict) -> dict[str, dict]:
    """Each table `capture add` asked a snapshot of, by the connector's source `offset`:
    its `state`, requested (the connector has not read the signal yet), running (the
    offset lists it among the incremental snapshot's tables) or done; while it runs on a
    single integer key, the chunk's last key read (`at_key`) and the table's greatest
    (`last_key`) at the snapshot's start."""
    asked = (read_json(settings.capture_file, {}) or {}).get("snapshots", {})
    running = _snapshotting(offset)
    read_up_to = offset_lsn(offset)
    states = {}
    for table, info in sorted(asked.items()):
        if table in running:
            at, last = (_integer_key(offset.get(k)) for k in ("incremental_snapshot_primary_key",
                                                              "incremental_snapshot_maximum_key"))
            states[table] = {"state": "running", **({"at_key": at, "last_key": last} if at is not None else {})}
        elif info["state"] == "requested" or read_up_to < info["signal_lsn"]:
            states[table] = {"state": "requested"}
        else:
            states[table] = {"state": "done"}
    return states


def signal(settings: Settings, tables: list[str]) -> int:
    """One `execute-snapshot` signal for `tables` (incremental: in chunks, beside the
    stream); returns the WAL position after it (the connector has read it past there)."""
    collections = [re.escape(schema) + r"\." + re.escape(table) for schema, table in (t.split(".", 1) for t in tables)]
    with pg_connect(settings, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {SIGNAL_TABLE} (id, type, data) VALUES (%s, 'execute-snapshot', %s)",
                     (str(uuid.uuid4()), json.dumps({"data-collections": collections, "type": "incremental"})))
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _captured(tables, capture: CaptureSet) -> list[str]:
    return [f"{schema}.{table}" for schema, table, _ in tables if capture.captures(schema, table)]


# Debezium keeps an incremental snapshot's keys in its offset as a Java-serialized Object[]
# (hex). For a one-column key of type Long or Integer the value is the last 8 or 4 bytes.
_ONE_ELEMENT = ("aced0005" "7572" "0013" "5b4c6a6176612e6c616e672e4f626a6563743b"  # stream header, an array of [Ljava.lang.Object;
                "90ce589f1073296c" "020000" "7870" "00000001")                # its serial UID, no fields, length 1
_INTEGERS = {"6a6176612e6c616e672e4c6f6e67": 16, "6a6176612e6c616e672e496e7465676572": 8}  # java.lang.Long, Integer


def _integer_key(serialized: str | None) -> int | None:
    """The key a serialized one-element Object[] holds, when it is a Long or an Integer."""
    if not serialized or not serialized.startswith(_ONE_ELEMENT):
        return None
    digits = next((n for name, n in _INTEGERS.items() if serialized.count(name) == 1), None)
    return int(serialized[-digits:], 16) if digits else None


def _snapshotting(offset: dict) -> set[str]:
    """The tables an incremental snapshot in progress still has to read: the source
    offset's `incremental_snapshot_collections` (JSON, a list of objects)."""
    raw = offset.get("incremental_snapshot_collections")
    try:
        collections = json.loads(raw) if isinstance(raw, str) else raw or []
    except ValueError:
        return set()
    return {c.get("incremental_snapshot_collections_id", "") for c in collections if isinstance(c, dict)}
