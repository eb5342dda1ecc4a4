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
  6. Reset every projection but the changelog and the ledger (KEPT): its tables, state
     (the mirrors' tombstones), checkpoint and progress (sync/delta/catalog.py `clear`),
     and what its own `reset` adds (the views: the search index). Started again
     (`lakesync run`), they read only records after the offsets of step 4, that is the
     snapshot and what follows it. The changelog keeps its history (with the gap, which no one can fill);
     its check in `verify` starts at the same offsets.
  7. Wait until the connector streams again.
"""

from __future__ import annotations

from projections import changelog, mirrors
from projections.ledger import projection as ledger
from sync.commands import all_projections
from sync.config import CONNECTOR_NAME, SLOT, Settings
from sync.delta import catalog
from sync.stack.background import stop_background
from sync.stack.connect import Connect, rest, wait_for_state
from sync.stack.postgres import pg_connect
from sync.streaming.offsets import end_offsets
from sync.streaming.stream import note_start_offsets

# Not reset: the changelog keeps its history (with the gap), and the ledger reads the
# outbox's event topic, which a snapshot does not replay.
KEPT = {changelog.NAME, ledger.NAME}


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
    # (The transaction boundaries' topic too: an END before the gap names changes never read.)
    note_start_offsets(settings, end_offsets(settings, mirrors.WHOLE_TRANSACTIONS.pattern))
    rest(settings, "DELETE", f"/connectors/{CONNECTOR_NAME}/offsets")
    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
    say("  connector            offsets reset, snapshotting")
    for projection in all_projections(settings):
        if projection.name in KEPT:
            continue
        catalog.clear(settings, projection)
        projection.reset(settings)
        say(f"  {projection.name:<20} reset; it rebuilds from the snapshot when the runner starts")
    Connect(settings).register()
    say("  connector            streaming")
