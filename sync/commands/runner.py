"""The runner: one Spark driver, one streaming query per projection.

`run(once=False)` keeps the queries going with a processing-time trigger until it is
stopped (SIGTERM/SIGINT stop the queries between batches). `run(once=True)` uses
availableNow triggers: every query processes what Kafka holds at start, then returns.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from pathlib import Path

from projections import all_projections
from sync.streaming import metrics, spark as spark_session
from sync.config import ROOT, Settings
from sync.delta import fencing
from sync.errors import Fenced, LakesyncError, ServiceUnavailable
from sync.stack.kafka import kafka_ready
from sync.stack.process import pid_alive, read_pid, spawn, stop_pid, wait_until

class RunnerFailed(LakesyncError):
    exit_code = 1


def run(settings: Settings, once: bool = False) -> None:
    if not kafka_ready(settings.kafka_bootstrap, timeout=5):
        raise ServiceUnavailable(f"Kafka is unreachable at {settings.kafka_bootstrap}")
    if read_pid(settings.runner_pidfile):
        raise RunnerFailed(f"a runner is already running (pid {read_pid(settings.runner_pidfile)}); "
                           "two runners of the same projections must not both commit")
    reap_orphaned_jvm(settings)
    projections = all_projections()
    sampler = metrics.serve(settings, projections)  # first: a port in use stops us before Spark starts
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        spark = spark_session.session(settings, "lakesync-runner")
        # The fencing tokens of this run, every one before any query commits: any older
        # runner still alive is now a zombie, whatever moment it wakes up at.
        fences = {p.NAME: fencing.take(spark, settings, p.NAME, [t.table for t in p.targets(settings) if t.delta])
                  for p in projections}
        # Written before the first batch: `start_background` and `status` read it.
        settings.runner_pidfile.parent.mkdir(parents=True, exist_ok=True)
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
        settings.runner_jvm_pidfile.write_text(f"{jvm} {os.getpid()}")
        settings.runner_pidfile.write_text(str(os.getpid()))
        queries = []
        by_name = {p.NAME: p for p in projections}
        restarts = dict.fromkeys(by_name, 0)
        # A projection fed by Delta tables (views) starts once its tables exist; with
        # availableNow, once the projections feeding them have finished, so it sees them whole.
        waiting = [p for p in projections if hasattr(p, "ready") and (once or not p.ready(settings))]
        for projection in projections:
            if projection not in waiting:
                queries.append(_start(spark, settings, projection, once, fences[projection.NAME]))
        while not stop.is_set():
            upstream_done = all(not q.isActive for q in queries)
            for projection in list(waiting):
                if projection.ready(settings) and (upstream_done or not once):
                    queries.append(_start(spark, settings, projection, once, fences[projection.NAME]))
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


def reap_orphaned_jvm(settings: Settings) -> None:
    """Kill the Spark JVM a dead runner left behind, before a new run starts.

    A runner killed with SIGKILL leaves its JVM running until the JVM notices its stdin
    closed, and then it shuts its queries down gracefully. Meanwhile its queries may still
    write the next entry of their offset logs, and a new run writing the same entry fails
    with "multiple streaming jobs detected". Its Python half is gone, so it cannot commit
    a batch: killing it loses nothing. The file names the JVM and its runner; the JVM is
    killed only when that runner is dead (a paused runner is left to the fencing tokens)
    and the pid still is a Spark JVM (pids are reused).
    """
    try:
        jvm, runner = (int(pid) for pid in settings.runner_jvm_pidfile.read_text().split())
    except (OSError, ValueError):
        jvm = runner = 0
    if jvm and pid_alive(jvm) and not pid_alive(runner):
        try:
            command = Path(f"/proc/{jvm}/cmdline").read_bytes()
        except OSError:
            command = b""
        if b"org.apache.spark.deploy.SparkSubmit" in command:
            os.kill(jvm, signal.SIGKILL)
            wait_until(lambda: not pid_alive(jvm), 30, f"the exit of a dead runner's JVM (pid {jvm})")
    settings.runner_jvm_pidfile.unlink(missing_ok=True)


def _start(spark, settings: Settings, projection, once: bool, fence: fencing.Fence):
    # A pool per projection: the FAIR scheduler shares the two cores between them.
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", projection.NAME)
    return projection.start(spark, settings, once, fence)


def start_background(settings: Settings) -> int:
    """Start `lakesync run` as a background process (unless one runs); returns its pid."""
    pid = read_pid(settings.runner_pidfile)
    if pid:
        return pid
    log = settings.logs / "runner.log"
    pid = spawn([sys.executable, "-m", "sync", "run"], None, log,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_until(lambda: _started_or_dead(settings, pid, log), 180, "the runner", log)
    return pid


def stop_background(settings: Settings, timeout: float = 120) -> bool:
    """Stop a running runner between batches; True if one ran.

    SIGTERM goes to the runner alone: it stops its queries, closes its fences, and its
    Spark JVM exits after it. A signal to the whole process group would reach the JVM
    too, whose shutdown hook stops Spark under the queries. SIGKILL after `timeout`."""
    pid = read_pid(settings.runner_pidfile)
    if pid:
        stop_pid(pid, timeout=timeout, group=False)
    return pid is not None


def _started_or_dead(settings: Settings, pid: int, log) -> bool:
    if not pid_alive(pid):
        raise RunnerFailed(f"the runner exited during start-up; see {log}")
    return read_pid(settings.runner_pidfile) == pid


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
