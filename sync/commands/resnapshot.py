"""Recovery after the replication slot was lost: a fresh snapshot, mirrors rebuilt from it.

When the slot is gone (dropped, or invalidated by Postgres), the changes made while it
was missing are lost to the log for good. The source tables still hold the truth, so
the mirrors are rebuilt from a new consistent snapshot. Steps of `resnapshot`, in order:
  1. Stop the runner: nothing may commit while the mirrors are replaced.
  2. Stop the connector (Connect's PUT .../stop), so its offsets can be reset.
  3. Drop what is left of the slot (an invalidated slot cannot be resumed).
  4. Note the end offset of every captured topic: the new snapshot's records come after.
     Written to <lake>/_resnapshot.json before anything is reset, so a crash from here on
     is finished by running `resnapshot` again.
  5. Reset the connector's source offsets and resume it: with no offsets Debezium
     creates a new slot and takes an initial snapshot (op r) of every table.
  6. Reset the mirrors: their tables, tombstones, checkpoint and progress. Started
     again (`lakesync run`), they read only records after the offsets of step 4, that
     is the snapshot and what follows it. The changelog keeps its history (with the
     gap, which no one can fill); its check in `verify` starts at the same offsets.
     The views, the search index and the event-time tables are reset too and rebuild
     from the same offsets (`reset` in projections/views/projection.py and event_time.py).
  7. Wait until the connector streams again.
"""

from __future__ import annotations

import shutil

from projections.event_time import projection as event_time
from projections import mirrors
from projections.views import projection as views
from sync.delta import catalog
from sync.config import CONNECTOR_NAME, SLOT, Settings
from sync.commands.freshness import end_offsets, pg_connect
from sync.commands.runner import stop_background
from sync.stack.connect import Connect, rest, wait_for_state
from sync.streaming.stream import note_start_offsets


def resnapshot(settings: Settings, say=print) -> None:
    if stop_background(settings):
        say("  runner               stopped")
    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/stop")
    wait_for_state(settings, "STOPPED")
    say("  connector            stopped")
    with pg_connect(settings, autocommit=True) as conn:
        dropped = conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                               "WHERE slot_name = %s AND NOT active", (SLOT,)).fetchall()
    say(f"  replication slot     {'dropped' if dropped else 'already gone'}")
    note_start_offsets(settings, end_offsets(settings, mirrors.TOPIC_PATTERN))
    rest(settings, "DELETE", f"/connectors/{CONNECTOR_NAME}/offsets")
    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
    say("  connector            offsets reset, snapshotting")
    for folder in (catalog.root(settings, mirrors.NAME) / "mirrors", *mirrors.state_paths(settings),
                   catalog.checkpoint(settings, mirrors.NAME)):
        shutil.rmtree(folder, ignore_errors=True)
    catalog.progress_file(settings, mirrors.NAME).unlink(missing_ok=True)
    say("  mirrors              reset; they rebuild from the snapshot when the runner starts")
    views.reset(settings)
    event_time.reset(settings)
    say("  views, event time    reset; they rebuild from the snapshot when the runner starts")
    Connect(settings).register()
    say("  connector            streaming")
