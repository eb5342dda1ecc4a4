"""How far each projection is behind Postgres, and the freshness barrier (`lakesync wait`).

The barrier's steps, in order:
  1. Read Postgres' current WAL position L. Every transaction that committed before the
     call has its commit record below L.
  2. Touch the heartbeat row, so that a captured change exists after L even when the
     database is otherwise idle (the connector has something to confirm).
  3. Wait until Kafka Connect's committed source offset for the connector reaches L.
     Connect commits a source offset only once every record before it has been
     acknowledged by Kafka, and Debezium emits transactions in commit order, so every
     change committed before L is then in Kafka.
  4. Take the end offsets of every topic each Kafka-fed projection reads.
  5. Wait until each such projection's last committed batch (its Spark checkpoint)
     covers those end offsets. Its Delta tables then reflect every transaction from step 1.
  6. For a projection fed by Delta tables (the views, fed by the changelog and the
     ledger): take its input tables' latest versions, now that their writers are fresh,
     and wait until its checkpoint has read past them.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from projections import all_projections
from sync.stack import capture
from sync.delta import catalog
from sync.config import CONNECTOR_NAME, HEARTBEAT_TABLE, Settings
from sync.errors import NotFresh, ServiceUnavailable
from sync.stack.connect import rest

Offsets = dict[tuple[str, int], int]  # (topic, partition) -> next offset


@dataclass
class Lag:
    projection: str
    behind: int                 # records in Kafka not yet covered by a committed batch
    end: Offsets
    processed: Offsets


def pg_connect(settings: Settings, **kwargs) -> psycopg.Connection:
    try:
        return psycopg.connect(settings.pg_dsn, connect_timeout=5, **kwargs)
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "unreachable"
        raise ServiceUnavailable(f"Postgres is unreachable at {settings.pg_host}:{settings.pg_port}: {reason}") from None


def parse_lsn(text: str) -> int:
    """'0/1A2B3C' -> integer LSN."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def wal_position_and_touch(settings: Settings) -> int:
    with pg_connect(settings, autocommit=True) as conn:
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        conn.execute(f"INSERT INTO {HEARTBEAT_TABLE} (id, beat_at) VALUES (2, clock_timestamp()) "
                     "ON CONFLICT (id) DO UPDATE SET beat_at = EXCLUDED.beat_at")
    return parse_lsn(lsn)


def connector_lsn(settings: Settings) -> int:
    """The highest LSN in the connector's committed source offset (0 if none yet)."""
    answer = rest(settings, "GET", f"/connectors/{CONNECTOR_NAME}/offsets")
    best = 0
    for entry in answer.get("offsets", []):
        offset = entry.get("offset") or {}
        best = max([best] + [int(offset[k]) for k in ("lsn", "lsn_proc", "lsn_commit") if offset.get(k)])
    return best


def end_offsets(settings: Settings, pattern: str) -> Offsets:
    regex = re.compile(pattern)
    try:
        metadata = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=10)
    except Exception as error:  # librdkafka raises KafkaException with a long text
        raise ServiceUnavailable(f"Kafka is unreachable at {settings.kafka_bootstrap} ({error})") from None
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "lakesync-freshness",
                         "enable.auto.commit": False})
    try:
        ends: Offsets = {}
        for topic, meta in metadata.topics.items():
            if not regex.fullmatch(topic):
                continue
            for partition in meta.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                ends[(topic, partition)] = high
        return ends
    finally:
        consumer.close()


def processed_offsets(checkpoint: Path) -> Offsets:
    """The end offsets of the last batch the query committed (from its checkpoint)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.is_dir() else []
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    done: Offsets = {}
    for line in lines[2:]:
        for topic, partitions in json.loads(line).items():
            for partition, offset in partitions.items():
                done[(topic, int(partition))] = int(offset)
    return done


def latest_version(table: str) -> int:
    """The latest version of a Delta table, from its log's file names (-1: no table)."""
    log = Path(table) / "_delta_log"
    return max((int(p.stem) for p in log.glob("[0-9]*.json")), default=-1)


def processed_versions(checkpoint: Path, tables: list[str]) -> Offsets:
    """For a query streaming from Delta tables (its sources in `tables` order): the next
    version of each table it will read, from its last committed batch. Delta's offset
    (v, index -1) means every version before v has been read."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.is_dir() else []
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()[2:]
    done: Offsets = {}
    for table, line in zip(tables, lines):
        # (v, index i >= 0) means version v is read up to its file i: v is not done either.
        offset = json.loads(line) if line.strip() not in ("", "-") else {}
        done[(table, 0)] = int(offset.get("reservoirVersion", 0))
    return done


def input_ends(settings: Settings, projection) -> Offsets:
    """What a projection has to read: per Kafka topic partition the next offset, or per
    input Delta table (as partition 0) the next version."""
    if projection.TOPIC_PATTERN is not None:
        return end_offsets(settings, projection.TOPIC_PATTERN)
    return {(t, 0): latest_version(t) + 1 for t in projection.inputs(settings) if latest_version(t) >= 0}


def processed(settings: Settings, projection) -> Offsets:
    """What its last committed batch has read, in the same terms as `input_ends`."""
    checkpoint = catalog.checkpoint(settings, projection.NAME)
    if projection.TOPIC_PATTERN is not None:
        return processed_offsets(checkpoint)
    return processed_versions(checkpoint, projection.inputs(settings))


def lags(settings: Settings) -> list[Lag]:
    result = []
    for projection in all_projections():
        end, done = input_ends(settings, projection), processed(settings, projection)
        behind = sum(max(0, high - done.get(tp, 0)) for tp, high in end.items())
        result.append(Lag(projection.NAME, behind, end, done))
    return result


NO_RUNNER_GRACE_SECONDS = 60  # how long the barrier waits for a runner that is not there


def wait(settings: Settings, timeout: float = 120.0) -> float:
    """The freshness barrier; returns the seconds it took or raises NotFresh."""
    started = time.monotonic()
    deadline = started + timeout
    target_lsn = wal_position_and_touch(settings)
    checked = 0.0
    while connector_lsn(settings) < target_lsn:
        if time.monotonic() - checked > 2:  # a broken capture never catches up: say why now
            checked = time.monotonic()
            with pg_connect(settings) as conn:
                broken = capture.problems(settings, conn)
            if broken:
                raise NotFresh("capture is broken: " + "; ".join(broken))
        if time.monotonic() > deadline:
            raise NotFresh(f"not fresh after {timeout:.0f}s: Debezium has not captured up to "
                           f"the WAL position of the call (connector {CONNECTOR_NAME})")
        time.sleep(0.2)
    drain(settings, started, deadline)
    return time.monotonic() - started


def drain(settings: Settings, started: float, deadline: float, names: set[str] | None = None) -> None:
    """Steps 4 to 6: wait until every projection (or those in `names`, and everything a
    Delta-fed one among them reads) has read what its inputs hold now. The barrier calls
    it after capture, `rebuild --verify` while capture is paused. Raises NotFresh."""
    timeout = deadline - started
    chosen = all_projections()
    if names is not None and not any(p.TOPIC_PATTERN is None and p.NAME in names for p in chosen):
        chosen = [p for p in chosen if p.NAME in names]
    kafka_fed = [p for p in chosen if p.TOPIC_PATTERN is not None]
    goals = {p.NAME: input_ends(settings, p) for p in kafka_fed}
    delta_fed = [p for p in chosen if p.TOPIC_PATTERN is None]
    runner_seen = time.monotonic()
    while True:
        behind = []
        for projection in kafka_fed + [p for p in delta_fed if p.NAME in goals]:
            done = processed(settings, projection)
            missing = sum(max(0, high - done.get(tp, 0)) for tp, high in goals[projection.NAME].items())
            if missing:
                unit = "records" if projection.TOPIC_PATTERN is not None else "table versions"
                behind.append(f"{projection.NAME} ({missing} {unit} behind)")
        if not behind:
            if all(p.NAME in goals for p in delta_fed):
                return
            # Step 6: the Delta inputs are complete now; their versions are the next goal.
            goals.update({p.NAME: input_ends(settings, p) for p in delta_fed})
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
    from sync.stack.process import read_pid

    return read_pid(settings.runner_pidfile) is not None
