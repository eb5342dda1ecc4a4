"""The runner: one Spark driver, one streaming query per projection.

`run(once=False)` keeps the queries going with a processing-time trigger until it is
stopped (SIGTERM/SIGINT stop the queries between batches). `run(once=True)` uses
availableNow triggers: every query processes what Kafka holds at start, then returns;
the projections that apply whole source transactions stop at the last one whose END was
in Kafka when the run began (`Settings.transactions_until`), so they end together,
though each query reads to Kafka's end as it starts and the connector's heartbeats keep
committing transactions. Without --once, their batches stop at common places
(`Settings.aligned`), so that the consistent point moves under load; with it they do
not: a projection ahead of the one it follows would hold what that one had not reached
when its query ran out of records, and the run would end with it behind.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from sync.cdc.transactions import TRANSACTIONS_TOPIC
from sync.commands import all_projections
from sync.commands.snapshot import FOLLOW_ORDER
from sync.config import Settings
from sync.delta import fencing
from sync.errors import Fenced, RunnerFailed, ServiceUnavailable
from sync.projection import KafkaTopics, Projection
from sync.stack.background import reap_orphaned_jvm
from sync.stack.kafka import kafka_ready
from sync.stack.process import read_pid
from sync.streaming import metrics
from sync.streaming import spark as spark_session
from sync.streaming.offsets import end_offsets
from sync.streaming.stream import EXECUTOR_LOSS_RESTARTS, executor_lost


def run(settings: Settings, once: bool = False) -> None:
    if not kafka_ready(settings.kafka_bootstrap, timeout=5):
        raise ServiceUnavailable(f"Kafka is unreachable at {settings.kafka_bootstrap}")
    if read_pid(settings.runner_pidfile):
        raise RunnerFailed(f"a runner is already running (pid {read_pid(settings.runner_pidfile)}); "
                           "two runners of the same projections must not both commit")
    reap_orphaned_jvm(settings)
    if once and settings.whole_transactions:
        settings = replace(settings, transactions_until=end_offsets(
            settings, re.escape(TRANSACTIONS_TOPIC)).get((TRANSACTIONS_TOPIC, 0)))
    projections = all_projections(settings)
    if settings.whole_transactions and not once:  # batches stop at common places (sync/delta/points.py `follow`)
        settings = replace(settings, aligned=tuple(name for name in FOLLOW_ORDER
                                                   if name in {p.name for p in projections}))
    sampler = metrics.serve(settings, projections)  # first: a port in use stops us before Spark starts
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        spark = spark_session.session(settings, spark_session.RUNNER_APP, console=True)
        # The fencing tokens of this run, every one before any query commits: any older
        # runner still alive is now a zombie, whatever moment it wakes up at.
        fences = {p.name: fencing.take(spark, settings, p.name, [t.table for t in p.targets(settings) if t.delta])
                  for p in projections}
        # Written before the first batch: `start_background` and `status` read it.
        settings.runner_pidfile.parent.mkdir(parents=True, exist_ok=True)
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
        settings.runner_jvm_pidfile.write_text(f"{jvm} {os.getpid()}")
        settings.runner_pidfile.write_text(str(os.getpid()))
        queries = []
        by_name = {p.name: p for p in projections}
        restarts = dict.fromkeys(by_name, 0)
        losses = dict.fromkeys(by_name, 0)  # restarts after a lost executor since the last batch done
        # A projection fed by Delta tables (views) starts once its tables exist; with
        # availableNow, once the projections feeding them have finished, so it sees them whole.
        waiting = [p for p in projections if not isinstance(p.source(settings), KafkaTopics)
                   and (once or not p.ready(settings))]
        for projection in projections:
            if projection not in waiting:
                queries.append(_start(spark, settings, projection, once, fences[projection.name]))
        while not stop.is_set():
            upstream_done = all(not q.isActive for q in queries)
            for projection in list(waiting):
                if projection.ready(settings) and (upstream_done or not once):
                    queries.append(_start(spark, settings, projection, once, fences[projection.name]))
                    waiting.remove(projection)
            for index, query in enumerate(queries):
                if not query.isActive:
                    error = query.exception()
                    if error is not None:
                        fenced = _raised(error, Fenced)
                        if fenced:
                            raise Fenced(fenced)
                        if _checkpoint_conflict(error) and restarts[query.name] < CHECKPOINT_CONFLICT_RESTARTS:
                            # An older run still alive (a zombie) wrote this query's next
                            # offsets first. Its commits are fenced; ours resume from the
                            # checkpoint, replaying the batch it planned.
                            restarts[query.name] += 1
                            print(f"lakesync run: projection {query.name}: another run wrote its checkpoint; "
                                  f"restarting it ({restarts[query.name]}/{CHECKPOINT_CONFLICT_RESTARTS})",
                                  file=sys.stderr, flush=True)
                            queries[index] = _start(spark, settings, by_name[query.name], once,
                                                    fences[query.name])
                            continue
                        lost = executor_lost(error)
                        if lost:
                            # On a cluster (sync/stack/spark_cluster.py): Spark runs a lost
                            # executor's tasks again elsewhere, but not a batch whose kept
                            # results (localCheckpoint) were on it. Its query starts again from
                            # the checkpoint and replays the batch (its commits are idempotent).
                            losses[query.name] = 1 if query.lastProgress is not None else losses[query.name] + 1
                            if losses[query.name] <= EXECUTOR_LOSS_RESTARTS:
                                print(f"lakesync run: projection {query.name}: its batch lost an executor "
                                      f"({lost}); replaying it "
                                      f"({losses[query.name]}/{EXECUTOR_LOSS_RESTARTS})", file=sys.stderr, flush=True)
                                queries[index] = _start(spark, settings, by_name[query.name], once,
                                                        fences[query.name])
                                continue
                        raise RunnerFailed(f"projection {query.name} failed: {_first_line(error)}")
            if all(not q.isActive for q in queries) and not any(p.ready(settings) for p in waiting):
                break  # (a projection still waiting has no input tables: nothing to do)
            stop.wait(0.5)
        # Downstream first: a views batch may be waiting for the mirrors to catch up, and
        # must finish (or not start) while they still run.
        for query in reversed(queries):
            query.stop()
        # Every query has stopped, so the next run need not stamp the tables. (Not reached
        # when a stop fails: a SIGTERM sent to the whole process group also reaches the
        # JVM, whose shutdown hook stops Spark under the queries; the next run stamps.)
        for fence in fences.values():
            fence.close()
    finally:
        if sampler:
            sampler.stopped.set()
        if settings.runner_pidfile.exists() and settings.runner_pidfile.read_text() == str(os.getpid()):
            settings.runner_pidfile.unlink()
        if settings.runner_jvm_pidfile.exists() and settings.runner_jvm_pidfile.read_text().endswith(f" {os.getpid()}"):
            settings.runner_jvm_pidfile.unlink()  # our JVM exits with us (stdin closes)


def _start(spark: SparkSession, settings: Settings, projection: Projection, once: bool,
           fence: fencing.Fence) -> StreamingQuery:
    # A pool per projection: the FAIR scheduler shares the two cores between them.
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", projection.name)
    return projection.start(spark, settings, once, fence)


CHECKPOINT_CONFLICT_RESTARTS = 3  # a zombie writes at most one offsets entry per query before it blocks


def _checkpoint_conflict(error) -> bool:
    """Spark's guard against two queries on one checkpoint (its offset log's entry exists)."""
    text = str(getattr(error, "desc", None) or error)
    return "Multiple streaming jobs detected" in text or "ConcurrentModificationException" in text


def _raised(error, kind: type) -> str | None:
    """The message of a `kind` our batch function raised, from the query's error text."""
    marker = f"{kind.__module__}.{kind.__name__}: "
    for line in str(getattr(error, "desc", None) or error).splitlines():
        if line.strip().startswith(marker):
            return line.strip()[len(marker):]
    return None


def _first_line(error) -> str:
    text = str(getattr(error, "desc", None) or error)
    return text.strip().splitlines()[0][:500]
