"""`lakesync wait` and the lag `status` shows: how far each projection is behind Postgres.

The barrier's steps, in order:
  1. Read Postgres' current WAL position L. Every transaction that committed before the
     call has its commit record below L.
  2. Touch the heartbeat row, so that a captured change exists after L even when the
     database is otherwise idle (the connector has something to confirm).
  3. Wait until Kafka Connect's committed source offset for the connector reaches L.
     Connect commits a source offset only once every record before it has been
     acknowledged by Kafka, and Debezium emits transactions in commit order, so every
     change committed before L is then in Kafka. A broken capture (the slot gone or
     invalidated, a connector task failed) fails the barrier at once, even when the
     offset is already there.
  4. Take the end offsets of every topic each Kafka-fed projection reads.
  5. Wait until each such projection's last committed batch (its Spark checkpoint)
     covers those end offsets. Its Delta tables then reflect every transaction from step 1.
  6. For a projection fed by Delta tables (the views, fed by the changelog and the
     ledger): take its input tables' latest versions, now that their writers are fresh,
     and wait until its checkpoint has read past them.
`lakesync wait NAME ...` takes steps 4 to 6 for the named projections only (and for
what a Delta-fed one reads): read-your-writes on the mirrors need not wait for the views.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sync.commands import all_projections
from sync.config import CONNECTOR_NAME, Settings
from sync.errors import NotFresh
from sync.projection import KafkaTopics
from sync.stack import capture
from sync.stack.connect import offset_lsn, source_offset
from sync.stack.postgres import pg_connect
from sync.stack.process import read_pid
from sync.streaming.offsets import Offsets, input_ends, processed


@dataclass
class Lag:
    projection: str
    behind: int                 # records in Kafka not yet covered by a committed batch
    end: Offsets
    processed: Offsets


def connector_lsn(settings: Settings) -> int:
    """The highest LSN in the connector's committed source offset (0 if none yet)."""
    return offset_lsn(source_offset(settings))


def lags(settings: Settings) -> list[Lag]:
    result = []
    for projection in all_projections(settings):
        end, done = input_ends(settings, projection), processed(settings, projection)
        behind = sum(max(0, high - done.get(tp, 0)) for tp, high in end.items())
        result.append(Lag(projection.name, behind, end, done))
    return result


NO_RUNNER_GRACE_SECONDS = 60  # how long the barrier waits for a runner that is not there


def wait(settings: Settings, timeout: float = 120.0, names: set[str] | None = None) -> float:
    """The freshness barrier for every projection, or for those in `names`; returns the
    seconds it took or raises NotFresh."""
    started = time.monotonic()
    deadline = started + timeout
    captured(settings, started, deadline)
    drain(settings, started, deadline, names)
    return time.monotonic() - started


def captured(settings: Settings, started: float, deadline: float) -> None:
    """Steps 1 to 3: every transaction committed before the call is in Kafka (and one
    more, the heartbeat row's: `rebuild --verify` takes it to give every projection a
    next batch). Raises NotFresh."""
    target_lsn = capture.touch_heartbeat(settings, capture.BARRIER_ROW)
    checked = float("-inf")
    while True:
        # A broken capture never catches up: say why now. Checked before the offset, so at
        # least once: a barrier once found the offset past L with the slot gone.
        if time.monotonic() - checked > 2:
            checked = time.monotonic()
            with pg_connect(settings) as conn:
                broken = capture.problems(settings, conn)
            if broken:
                raise NotFresh("capture is broken: " + "; ".join(broken))
        if connector_lsn(settings) >= target_lsn:
            return
        if time.monotonic() > deadline:
            raise NotFresh(f"not fresh after {deadline - started:.0f}s: Debezium has not captured up to "
                           f"the WAL position of the call (connector {CONNECTOR_NAME})")
        time.sleep(0.2)


def drain(settings: Settings, started: float, deadline: float, names: set[str] | None = None) -> None:
    """Steps 4 to 6: wait until every projection (or those in `names`, and everything a
    Delta-fed one among them reads) has read what its inputs hold now. The barrier calls
    it after capture, `rebuild --verify` while capture is paused. Raises NotFresh."""
    timeout = deadline - started
    chosen = all_projections(settings)
    # Which are Delta-fed, decided once: a source names catalog paths (a file read each).
    fed_by_delta = {p.name for p in chosen if not isinstance(p.source(settings), KafkaTopics)}
    if names is not None and not fed_by_delta & names:
        chosen = [p for p in chosen if p.name in names]
    kafka_fed = [p for p in chosen if p.name not in fed_by_delta]
    goals = {p.name: input_ends(settings, p) for p in kafka_fed}
    delta_fed = [p for p in chosen if p.name in fed_by_delta]
    runner_seen = time.monotonic()
    while True:
        behind = []
        for projection in kafka_fed + [p for p in delta_fed if p.name in goals]:
            done = processed(settings, projection)
            missing = sum(max(0, high - done.get(tp, 0)) for tp, high in goals[projection.name].items())
            if missing:
                unit = "table versions" if projection.name in fed_by_delta else "records"
                behind.append(f"{projection.name} ({missing} {unit} behind)")
        if not behind:
            if all(p.name in goals for p in delta_fed):
                return
            # Step 6: the Delta inputs are complete now; their versions are the next goal.
            goals.update({p.name: input_ends(settings, p) for p in delta_fed})
            continue
        now = time.monotonic()
        if _runner_alive(settings):
            runner_seen = now
        elif now - runner_seen > NO_RUNNER_GRACE_SECONDS or now > deadline:
            # Nothing will catch up: say so now rather than at the deadline. The grace
            # covers a runner just launched, which writes its pidfile once its JVM is up.
            raise NotFresh(f"not fresh after {now - started:.0f}s: " + ", ".join(behind) +
                           "; no runner is running (`lakesync run`)")
        if now > deadline:
            raise NotFresh(f"not fresh after {timeout:.0f}s: " + ", ".join(behind))
        time.sleep(0.2)


def _runner_alive(settings: Settings) -> bool:
    return read_pid(settings.runner_pidfile) is not None
