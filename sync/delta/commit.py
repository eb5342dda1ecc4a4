"""The commit protocol of one micro-batch into one Delta table.

Effectively-once comes from three parts (DESIGN.md section 5): Kafka can replay, Spark's
checkpoint records which offsets each batch covered, and this commit is idempotent.

Steps of `commit_batch`, in order:
  1. Tag the session of *this* streaming query with Delta's transaction identifiers:
     txnAppId = the projection and its table, txnVersion = the batch id, and the commit's
     userMetadata with the run's epoch. Each query has its own cloned session, so
     concurrent projections never see each other's tags.
  2. Crash point `before_delta_commit`: the table is unchanged; the batch replays.
  3. Fencing (sync/delta/fencing.py): if a newer run of this projection has taken a
     higher epoch, this writer is a zombie and aborts here, before writing.
  4. Write (MERGE or append). Delta records (txnAppId, txnVersion) in the same atomic
     commit; a write whose txnVersion is not above the recorded one is skipped as
     already applied.
  5. Crash point `after_delta_commit`: the table holds the batch, but Spark has not yet
     recorded the batch as committed, so the batch replays and step 4 skips it.
  6. Clear the tags, so no later write in this session reuses them by accident.
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

from pyspark.sql import SparkSession

from sync.delta.fencing import Fence
from sync.fault import crash_point

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# Recorded in each commit's commitInfo.userMetadata: which run (epoch) wrote it.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def commit_batch(session: SparkSession, app_id: str, batch_id: int, write: Callable[[], None],
                 fence: Fence, fault: str = "") -> None:
    session.conf.set(TXN_APP_ID, app_id)
    session.conf.set(TXN_VERSION, str(batch_id))
    session.conf.set(USER_METADATA, json.dumps({"app_id": app_id, "batch": batch_id, "epoch": fence.epoch}))
    try:
        crash_point("before_delta_commit", fault)
        fence.check()
        write()
        crash_point("after_delta_commit", fault)
    finally:
        for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
            session.conf.unset(key)
