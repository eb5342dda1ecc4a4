"""The foreachBatch function every projection's query runs: what each batch shares.

Per micro-batch, in order:
  1. The query's own Spark session (a clone per query, so its Delta transaction tags
     stay there) and, once per run, `open`: the projection creates its tables and reads
     the state it keeps on the driver.
  2. One `BatchCommit` for all of the batch's Delta commits (sync/delta/commit.py:
     txnAppId per table, txnVersion = the batch id, fencing, crash points), and a
     `Steps` clock.
  3. `apply`: the projection's own work. It returns what it did, or None when the batch
     held nothing to apply (a metadata-only version of an input table). Independent
     parts of it (the mirrors' tables, the views' two chains) may run at once (`concurrently`), each on a Spark
     session of its own, so each part's Delta transaction tags stay its own.
  4. The progress record `status` reads, and the runner's metrics.
  5. A batch that stopped short (it held whole transactions to stand where the projections
     it follows stand: sync/delta/points.py `follow`) asks for the batch after it: a touch
     of the heartbeat table, a source transaction (at most every ASK_EVERY_SECONDS). A
     Kafka-fed query starts a batch only for new records, and an idle source writes one a
     minute (the connector's heartbeat).
Spark commits the batch's offsets after this returns; a crash anywhere above replays the
whole batch, and every commit of the replay is skipped or changes nothing.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.util import inheritable_thread_target

from sync.config import Settings
from sync.delta.commit import BatchCommit
from sync.delta.fencing import Fence
from sync.errors import ServiceUnavailable
from sync.stack.capture import NEXT_BATCH_ROW, touch_heartbeat
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome, Progress, Steps
from sync.streaming.spark import CODE_FACTORY, GENERATED, INTERPRETED

Result = TypeVar("Result")

# Step 5 at most this often per projection, as often as the connector's heartbeat used to
# commit: a follower whose leader stays behind (one holding a transaction whose END never
# comes) stops short at every batch, and must not start the next at once, again and again.
ASK_EVERY_SECONDS = 5.0


class Batch(ABC):
    """One projection's foreachBatch function (see the module docstring)."""

    # The batch size (records) from which its projections' code is generated (`code_for`);
    # None: always interpreted.
    generated_code_from: int | None = None

    def __init__(self, projection: str, settings: Settings, fence: Fence):
        self.projection, self.settings, self.fence = projection, settings, fence
        self.progress = Progress(settings, projection)
        self.opened = False
        self._worker_sessions: queue.SimpleQueue[SparkSession] | None = None
        self._code_factory: str | None = None  # `code_for`'s, set on every worker session
        self._asked_at = float("-inf")  # step 5's last touch (time.monotonic)
        self._ask_later: threading.Timer | None = None

    def open(self, spark: SparkSession) -> None:
        """Step 1, once per run (and again after a failed first batch)."""

    @abstractmethod
    def apply(self, records: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome | None:
        """Step 3: apply one batch, committing every Delta write through `commit`."""

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        started = time.time()
        if not self.opened:
            self.open(spark)
            self.opened = True
        commit = BatchCommit(spark, self.projection, batch_id, self.fence, self.settings.fault)
        steps = Steps()
        outcome = self.apply(records, commit, steps)
        if outcome is not None:
            self.progress.record(batch_id, outcome, started, steps.seconds)
        if outcome is not None and outcome.stopped_short:
            self._ask_for_next_batch(batch_id)

    def _ask_for_next_batch(self, batch_id: int) -> None:
        """Step 5: now, or once ASK_EVERY_SECONDS have passed since the last ask."""
        delay = self._asked_at + ASK_EVERY_SECONDS - time.monotonic()
        if delay <= 0:
            self._ask(batch_id)
        elif self._ask_later is None or not self._ask_later.is_alive():
            self._ask_later = threading.Timer(delay, self._ask, (batch_id,))
            self._ask_later.daemon = True
            self._ask_later.start()

    def _ask(self, batch_id: int) -> None:
        self._asked_at = time.monotonic()
        try:
            touch_heartbeat(self.settings, NEXT_BATCH_ROW)
        except (ServiceUnavailable, psycopg.Error) as error:  # the next beat starts it, a minute at most
            print(f"{self.projection}: batch {batch_id} held whole transactions, and could not ask for "
                  f"the batch after it ({error})", file=sys.stderr)

    def code_for(self, batch: DataFrame, partitions: BatchPartitions) -> None:
        """Generated projections for a Kafka batch of `generated_code_from` records or more,
        interpreted for a smaller one (sync/streaming/spark.py CODE_FACTORY), on the batch's
        session and on those `concurrently` hands out. Its size from the offsets it spans;
        counted where the batch function was called outside a query (the bench, tests)."""
        records = partitions.records()
        if records is None:
            records = batch.count()
        large = self.generated_code_from is not None and records >= self.generated_code_from
        self._code_factory = GENERATED if large else INTERPRETED
        batch.sparkSession.conf.set(CODE_FACTORY, self._code_factory)

    def concurrently(self, commit: BatchCommit, tasks: list[Callable[[BatchCommit], Result]]) -> list[Result]:
        """Run the tasks, at most `apply_threads` at once, each given the batch's commit on
        a session of its own (a new session of the query's: same Spark context and Delta
        log cache, its own settings). The threads inherit the query's scheduler pool. The
        results come back in the tasks' order; the first failure is raised."""
        workers = min(self.settings.apply_threads, len(tasks))
        if workers <= 1:
            return [task(commit) for task in tasks]
        if self._worker_sessions is None:  # made once per run: a new session's first query costs
            self._worker_sessions = queue.SimpleQueue()
            for _ in range(self.settings.apply_threads):
                self._worker_sessions.put(commit.spark.newSession())
        sessions = self._worker_sessions

        def run(task: Callable[[BatchCommit], Result]) -> Result:
            session = sessions.get()
            if self._code_factory is not None:
                session.conf.set(CODE_FACTORY, self._code_factory)
            try:
                return task(commit.fork(session))
            finally:
                sessions.put(session)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(inheritable_thread_target(commit.spark)(run), task) for task in tasks]
            return [future.result() for future in futures]
