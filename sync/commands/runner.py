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

Between two turns of its loop the runner also takes a `rebuild --swap` handed over to it:
it stops its queries, swaps the new generations in and starts them again, in the same
process (`hand_over_swap`, below).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from sync import lake
from sync.cdc.transactions import TRANSACTIONS_TOPIC
from sync.commands import REGISTRY, all_projections
from sync.commands.snapshot import FOLLOW_ORDER
from sync.config import Settings
from sync.delta import catalog, fencing
from sync.errors import Fenced, RunnerFailed, ServiceUnavailable
from sync.files import read_json, write_json_atomically
from sync.projection import KafkaTopics, Projection
from sync.stack.background import reap_orphaned_jvm
from sync.stack.kafka import kafka_ready
from sync.stack.process import pid_alive, read_pid
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
        for projection in REGISTRY:  # the old generation of a swap whose process died before retiring it
            catalog.retire_replaced(settings, projection, lambda line: print(f"lakesync run: {line}", file=sys.stderr))
        # The fencing tokens of this run, every one before any query commits: any older
        # runner still alive is now a zombie, whatever moment it wakes up at.
        fences = {p.name: fencing.take(spark, settings, p.name, [t.table for t in p.targets(settings) if t.delta])
                  for p in projections}
        # Written before the first batch: `start_background` and `status` read it.
        settings.runner_pidfile.parent.mkdir(parents=True, exist_ok=True)
        jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
        settings.runner_jvm_pidfile.write_text(f"{jvm} {os.getpid()}")
        settings.runner_pidfile.write_text(str(os.getpid()))
        by_name = {p.name: p for p in projections}
        restarts = dict.fromkeys(by_name, 0)
        losses = dict.fromkeys(by_name, 0)  # restarts after a lost executor since the last batch done
        queries, waiting = _start_queries(spark, settings, projections, once, fences)
        while not stop.is_set():
            request = _swap_request(settings)
            if request is not None:  # `rebuild --swap`, handed over (`hand_over_swap`)
                _swap(spark, settings, queries, fences, request)
                queries, waiting = _start_queries(spark, settings, projections, once, fences)
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
        _stop_queries(queries)
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


def _start_queries(spark: SparkSession, settings: Settings, projections: list[Projection], once: bool,
                   fences: dict[str, fencing.Fence]) -> tuple[list[StreamingQuery], list[Projection]]:
    """Every projection's query started, but for those fed by Delta tables (views) whose
    tables do not exist yet, returned: each starts once they do; with availableNow, once
    the projections feeding them have finished, so it sees them whole."""
    waiting = [p for p in projections if not isinstance(p.source(settings), KafkaTopics)
               and (once or not p.ready(settings))]
    queries = [_start(spark, settings, p, once, fences[p.name]) for p in projections if p not in waiting]
    return queries, waiting


def _stop_queries(queries: list[StreamingQuery]) -> None:
    """Downstream first: a views batch may be waiting for the mirrors to catch up, and
    must finish (or not start) while they still run."""
    for query in reversed(queries):
        query.stop()


# -- `rebuild --swap` in the running runner ---------------------------------------------------
# The rebuild hands its swap to the runner rather than stopping it and starting a new one:
# the runner's warm JVM goes on at once from the new generations' checkpoints, where a new
# runner process would spend its first minutes compiling (its first batches several times
# as long), and its metrics endpoint stays up. The hand-over, in order:
#   1. the rebuild writes its request (its pid, each projection's new generation and
#      folder) to `Settings.runner_swapfile`, and waits;
#   2. between two turns of its loop, the runner takes the request (removes the file) and
#      stops every query, downstream first, as at its own end (a query that reads or
#      follows a swapped projection resolves its tables when it starts);
#   3. per projection: its fence closed, the catalog pointed at the new generation (one
#      atomic rename), the old generation retired, a fence taken in the new one;
#   4. the runner writes what it did (or why it could not) to
#      `Settings.runner_swappedfile`, for the rebuild to print, and starts every query again.
# A runner that exits before it answers leaves the rest of the swap to the rebuild.
SWAP_TAKEN_SECONDS = 600  # how long a rebuild waits for the runner to take its request


def hand_over_swap(settings: Settings, generations: dict[str, tuple[int, str]]) -> list[str] | None:
    """Steps 1 and 4 (the rebuild's side): the running runner swaps `generations` (per
    projection: its new generation and folder) in. Returns the lines it reports, or None
    when no runner runs or it exited before answering (its queries have stopped: the
    caller swaps what it had not). Raises RunnerFailed when the runner could not swap."""
    pid = read_pid(settings.runner_pidfile)
    if pid is None:
        return None
    settings.runner_swappedfile.unlink(missing_ok=True)
    write_json_atomically(settings.runner_swapfile, {"by": os.getpid(), "generations": generations})
    deadline = time.monotonic() + SWAP_TAKEN_SECONDS
    while True:
        answer = read_json(settings.runner_swappedfile)
        if answer is not None and answer.get("by") == os.getpid():
            settings.runner_swappedfile.unlink(missing_ok=True)
            if answer["error"]:
                raise RunnerFailed(f"the runner could not swap the new generations in: {answer['error']}")
            return answer["said"]
        taken = not settings.runner_swapfile.exists()
        if read_pid(settings.runner_pidfile) != pid:  # it exited (whatever it did, its queries stopped)
            settings.runner_swapfile.unlink(missing_ok=True)
            return None
        if not taken and time.monotonic() > deadline:
            settings.runner_swapfile.unlink(missing_ok=True)
            raise RunnerFailed(f"the runner (pid {pid}) has not taken the swap within {SWAP_TAKEN_SECONDS} s; "
                               "nothing was swapped (the new generations are kept)")
        time.sleep(0.2)


def _swap_request(settings: Settings) -> dict | None:
    """Step 2's request, taken (its file removed); None when there is none, or its rebuild
    has exited (a request left by a rebuild that was killed is dropped)."""
    request = read_json(settings.runner_swapfile)
    if request is None:
        return None
    settings.runner_swapfile.unlink(missing_ok=True)
    by = request.get("by")
    return request if isinstance(by, int) and by > 0 and pid_alive(by) else None


def _swap(spark: SparkSession, settings: Settings, queries: list[StreamingQuery], fences: dict[str, fencing.Fence],
          request: dict) -> None:
    """Steps 2 to 4 (the runner's side); the caller starts the queries again. (A
    projection this runner does not run, LAKESYNC_PROJECTIONS leaving it out, is swapped
    all the same, and has no fence here.)"""
    _stop_queries(queries)
    said = ["swap: the runner's queries stopped between batches"]
    try:
        for name, (generation, folder) in request["generations"].items():
            projection = next(p for p in REGISTRY if p.name == name)
            if name in fences:
                fences[name].close()  # its query has stopped: the next taker need not stamp
            catalog.swap_in(settings, projection, generation, lake.at(folder), said.append)
            if name in fences:
                fences[name] = fencing.take(spark, settings, name,
                                            [t.table for t in projection.targets(settings) if t.delta])
    except Exception as error:
        _answer(settings, request, said, f"{type(error).__name__}: {error}")
        raise
    said.append("swap: the runner's queries started again, from the new generations' checkpoints")
    _answer(settings, request, said)


def _answer(settings: Settings, request: dict, said: list[str], error: str | None = None) -> None:
    """Step 4's answer to `request`: the lines to print, or why the runner could not swap."""
    write_json_atomically(settings.runner_swappedfile, {"by": request["by"], "said": said, "error": error})


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
