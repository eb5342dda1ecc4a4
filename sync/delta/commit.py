"""The commit protocol of one micro-batch into one Delta table.

Effectively-once comes from three parts: Kafka can replay, Spark's
checkpoint records which offsets each batch covered, and this commit is idempotent.

Steps of a commit (`BatchCommit`), in order:
  1. Tag the session of *this* streaming query with Delta's transaction identifiers:
     txnAppId = the projection and its table, txnVersion = the batch id, and the commit's
     userMetadata with the run's epoch. Each query has its own cloned session, so
     concurrent projections never see each other's tags; tables of one batch applied at
     once each commit on a session of their own (`fork`, sync/streaming/batch.py).
     An at-least-once append (`append(..., exactly_once=False)`) gets the userMetadata
     alone: it is for rows of which a second copy changes nothing a reader finds (the
     mirrors' tombstones), and spares Delta's check of the transaction id, which
     reconstructs the table's state first (a small append: 4 Spark jobs instead of 1).
  2. Crash point `before_delta_commit`: the table is unchanged; the batch replays.
  3. Fencing (sync/delta/fencing.py): if a newer run of this projection has taken a
     higher epoch, this writer is a zombie and aborts here, before writing.
  4. Write (MERGE, `merge`; or append, `append`). Delta records (txnAppId, txnVersion)
     in the same atomic commit; a write whose txnVersion is not above the recorded one
     is skipped as already applied. An append also carries them as the writer's options,
     which Delta takes before the session's: a DataFrame writes through the session it
     was made in, which need not be this one.
  5. Crash point `after_delta_commit`: the table holds the batch, but Spark has not yet
     recorded the batch as committed, so the batch replays and step 4 skips it (an
     at-least-once append is made again: its second copy changes nothing).
  6. Clear the tags, so no later write in this session reuses them by accident.
  7. After a MERGE that was not skipped: the deletion-vector rule (sync/delta/merge.py
     `deletion_vectors_if_copying`), a commit of its own, untagged.
Spark then writes the batch's commit marker; only after that does the next batch start.

| crash point                          | what holds after restart                       |
|--------------------------------------|------------------------------------------------|
| before the Delta commit              | batch replays; table unchanged meanwhile       |
| after the Delta commit, before the   | batch replays; the commit is skipped as        |
| offsets commit                       | already applied (same txnAppId/txnVersion)     |
| between two tables of one batch      | each table's commit is skipped or applied on   |
|                                      | its own (one txnAppId per table)               |
| Connect restart, redelivered events  | the newer-than guard ignores what a row has    |
|                                      | already seen (equal or older source position); |
|                                      | a delete's tombstone keeps older changes out   |
| a zombie runner of the same          | fenced: its epoch is older, its commit is      |
| projection                           | refused (step 3), or fails Delta's conflict    |
|                                      | check against the newer run's epoch stamp      |
"""

from __future__ import annotations

import json
from typing import Callable

from delta.tables import DeltaMergeBuilder
from pyspark.sql import DataFrame, SparkSession

from sync.delta.fencing import Fence
from sync.delta.merge import deletion_vectors_if_copying, merge_metrics
from sync.fault import crash_point

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# Recorded in each commit's commitInfo.userMetadata: which run (epoch) wrote it.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


class BatchCommit:
    """Every Delta commit of one batch of one projection.

    One per batch (sync/streaming/batch.py makes it); `commit(write, part)` runs the
    steps above with txnAppId `<projection>` or `<projection>:<part>` (one per table, so
    each table's commit is skipped or applied on its own) and txnVersion = the batch id.
    """

    def __init__(self, session: SparkSession, projection: str, batch_id: int, fence: Fence, fault: str = ""):
        self.spark, self.projection, self.batch_id = session, projection, batch_id
        self.fence, self.fault = fence, fault

    def fork(self, session: SparkSession) -> "BatchCommit":
        """The same batch's commits, tagged on another session (one per concurrent thread)."""
        return BatchCommit(session, self.projection, self.batch_id, self.fence, self.fault)

    def __call__(self, write: Callable[[], None], part: str = "", exactly_once: bool = True) -> None:
        app_id = self._app_id(part)
        conf = self.spark.conf
        tags = {USER_METADATA: self._user_metadata(app_id)}  # step 1
        if exactly_once:
            tags.update({TXN_APP_ID: app_id, TXN_VERSION: str(self.batch_id)})
        for key, value in tags.items():
            conf.set(key, value)
        try:
            crash_point("before_delta_commit", self.fault)  # step 2
            self.fence.check()  # step 3
            write()  # step 4
            crash_point("after_delta_commit", self.fault)  # step 5
        finally:
            for key in tags:  # step 6
                conf.unset(key)

    def merge(self, builder: DeltaMergeBuilder, path: str, part: str = "") -> dict[str, int]:
        """MERGE into the Delta table at `path` (`builder` made on this commit's session) in
        this batch's commit; Delta's metrics, empty when the commit was skipped as
        already applied. Then step 7."""
        metrics = {}
        self(lambda: metrics.update(merge_metrics(builder.execute())), part)
        if metrics:
            deletion_vectors_if_copying(self.spark, path)
        return metrics

    def append(self, frame: DataFrame, path: str, part: str = "", exactly_once: bool = True) -> None:
        """Append `frame` to the Delta table at `path` in this batch's commit; with
        `exactly_once` False, without a transaction id (step 1), for rows a replay may
        append again without changing what any reader of them finds."""
        app_id = self._app_id(part)
        writer = frame.write.format("delta").mode("append").option("userMetadata", self._user_metadata(app_id))
        if exactly_once:
            writer = writer.option("txnAppId", app_id).option("txnVersion", self.batch_id)
        self(lambda: writer.save(path), part, exactly_once)

    def _app_id(self, part: str) -> str:
        return f"{self.projection}:{part}" if part else self.projection

    def _user_metadata(self, app_id: str) -> str:
        return json.dumps({"app_id": app_id, "batch": self.batch_id, "epoch": self.fence.epoch})
