"""Merge rate against the size of the target: does a batch's cost follow the batch or the table?

For each size S (rows already in the mirror), the mirrors' own batch function
(projections/mirrors.py MirrorBatch: decode, refuse, latest per key, MERGE, tombstones,
every step the runner does) applies batches of B Debezium change records to a mirror
holding S rows, and the rate is B / seconds. No Kafka: the records are made here in
Debezium's JSON envelope, so only the apply is measured.

Steps, per size:
  1. A fresh lake; one record through MirrorBatch creates the mirror with its schema
     and properties as the runner would (no deletion vectors until a MERGE copies many
     rows: the first timed batch at each size turns them on, sync/delta/merge.py).
  2. S rows appended in key order, in files of about ROWS_PER_FILE rows: the layout a
     mirror built from a snapshot and then appended to has (new keys are the highest).
  3. RUNS batches of B records each, timed one by one; the median is reported. A batch is
     the live mix: 60% updates of hot keys (among the newest rows), 30% inserts of new
     keys, 10% deletes of cold keys (the oldest rows).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import statistics
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sync.config import Settings

TOPIC = "lakesync.public.bench_merge"
ROWS_PER_FILE = 250_000
RUNS = 3
FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "string", "optional": True, "field": "price",
     "parameters": {"__debezium.source.column.type": "NUMERIC", "__debezium.source.column.length": "12",
                    "__debezium.source.column.scale": "2"}},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "seen_at"},
]
ROW = {"type": "struct", "fields": FIELDS, "optional": True}
VALUE_SCHEMA = json.dumps({"type": "struct", "fields": [{**ROW, "field": "before"}, {**ROW, "field": "after"},
                                                       {"type": "struct", "field": "source", "fields": []},
                                                       {"type": "string", "field": "op"}]})
KEY_SCHEMA = json.dumps({"type": "struct", "fields": [FIELDS[0]], "optional": False})


def record(op: str, key: int, position: int) -> tuple[bytes, bytes]:
    """One Debezium change record (key, value) of table bench_merge at `position`."""
    row = "null" if op == "d" else (f'{{"id":{key},"name":"row {key} at {position}",'
                                    f'"price":"{key % 100000}.{position % 100:02d}",'
                                    f'"seen_at":"2026-11-22T10:15:00.{position % 1000000:06d}Z"}}')
    before = f'{{"id":{key},"name":null,"price":null,"seen_at":null}}' if op == "d" else "null"
    value = (f'{{"schema":{VALUE_SCHEMA},"payload":{{"before":{before},"after":{row},"op":"{op}",'
             f'"source":{{"sequence":"[\\"{position}\\",\\"{position}\\"]","lsn":{position},'
             f'"txId":{position},"ts_us":1795342500000000}}}}}}')
    return f'{{"schema":{KEY_SCHEMA},"payload":{{"id":{key}}}}}'.encode(), value.encode()


def changes(rng: random.Random, next_key: int, oldest: int, batch: int, position: int):
    """The records of one batch against a table of keys [oldest, next_key): 60% updates,
    30% inserts, 10% deletes."""
    inserts = range(next_key, next_key + int(batch * 0.3))
    deletes = range(oldest, oldest + int(batch * 0.1))
    # Updates: distinct keys among the newest rows (the hot tenth of the table, or twice
    # what is needed), as in a shop where recent orders change and old ones rest.
    wanted = batch - len(inserts) - len(deletes)
    window = range(max(deletes.stop, next_key - max(wanted * 2, (next_key - oldest) // 10)), next_key)
    updates = rng.sample(window, min(wanted, len(window)))
    ops = [("u", k) for k in updates] + [("c", k) for k in inserts] + [("d", k) for k in deletes]
    rng.shuffle(ops)
    return [record(op, key, position + i) for i, (op, key) in enumerate(ops)], len(inserts), len(deletes)


def measure(spark: SparkSession, settings: Settings, sizes: list[int], batch: int, workdir: Path,
            say=print) -> dict[str, dict]:
    """{str(size): {"events_per_s", "batch_events", "runs_seconds", "files", "steps_seconds"}}
    per size; `steps_seconds` is where the median batch's time went (MirrorBatch's steps)."""
    from projections import mirrors
    from sync.delta import fencing

    results = {}
    for size in sizes:
        lake = workdir / f"merge-{size}"
        shutil.rmtree(lake, ignore_errors=True)
        local = dataclasses.replace(settings, lake=lake, roots=(), search_url="", metrics_port=0)
        apply = mirrors.MirrorBatch(local, fencing.take(spark, local, mirrors.NAME, []))
        frame = lambda rows, first: spark.createDataFrame(  # noqa: E731
            [(k, v, TOPIC, 0, first + i, None) for i, (k, v) in enumerate(rows)], mirrors.RECORDS_DDL)
        apply(frame([record("c", 0, 1)], 0), 0)  # step 1
        path = str(mirrors.mirror_path(local, "bench_merge"))
        schema = spark.read.format("delta").load(path).schema
        say(f"  merge: writing a mirror of {size:,} rows")
        rows = (spark.range(1, size + 1, numPartitions=max(1, size // ROWS_PER_FILE))  # step 2
                .select(F.col("id"), F.concat(F.lit("row "), F.col("id")).alias("name"),
                        (F.col("id") % 100000).cast("decimal(12,2)").alias("price"),
                        F.lit("2026-11-22 10:15:00").cast("timestamp").alias("seen_at"),
                        F.lit(2).cast("bigint").alias("_commit_lsn"), F.lit(2).cast("bigint").alias("_lsn"),
                        F.lit(2).cast("bigint").alias("_txid"),
                        F.lit("2026-11-22 10:15:00").cast("timestamp").alias("_source_ts"),
                        F.lit("r").alias("_op"), F.lit(TOPIC).alias("_topic"), F.lit(0).alias("_partition"),
                        F.col("id").alias("_offset"), F.current_timestamp().alias("_applied_at")))
        rows.select(*[F.col(f.name).cast(f.dataType) for f in schema]).write.format("delta").mode("append").save(path)
        rng, rates, seconds, steps = random.Random(size), [], [], []
        next_key, oldest, position, offset = size + 1, 1, 10, size + 1
        for run in range(RUNS):  # step 3
            records, inserted, deleted = changes(rng, next_key, oldest, batch, position)
            data = frame(records, offset).localCheckpoint(eager=True)
            started = time.monotonic()
            apply(data, run + 1)
            seconds.append(time.monotonic() - started)
            steps.append(apply.progress.state.get("last_batch_steps", {}))
            rates.append(len(records) / seconds[-1])
            next_key, oldest = next_key + inserted, oldest + deleted
            position, offset = position + len(records), offset + len(records)
        rate = statistics.median(rates)
        median_run = rates.index(rate) if rate in rates else 0
        results[str(size)] = {"events_per_s": round(rate), "batch_events": len(records),
                              "runs_seconds": [round(s, 3) for s in seconds], "files": _files(spark, path),
                              "steps_seconds": steps[median_run]}
        say(f"  merge into {size:,} rows: {len(records):,} changes per batch, {rate:,.0f} events/s "
            f"(batches took {', '.join(f'{s:.1f}' for s in seconds)} s)")
        shutil.rmtree(lake, ignore_errors=True)
    return results


def _files(spark: SparkSession, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])
