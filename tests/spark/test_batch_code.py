"""A batch function's projections' code: generated for a large Kafka batch, interpreted for a
small one, on its session and on every session its parts run on (real Spark)."""

import dataclasses

import pytest

from sync import config
from sync.delta import catalog, fencing
from sync.streaming.batch import Batch
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome
from sync.streaming.spark import CODE_FACTORY, GENERATED, INTERPRETED
from tests.unit.test_batch_size import offsets

pytestmark = pytest.mark.spark


class Sized(Batch):
    """Records the code factory its session and its parts' sessions run with."""

    generated_code_from = 100

    def __init__(self, settings, fence):
        super().__init__("sized", settings, fence)
        self.seen: list[list[str]] = []

    def apply(self, records, commit, steps):
        self.code_for(records, BatchPartitions(self.settings, catalog.checkpoint(self.settings, "sized"), commit.batch_id))
        parts = self.concurrently(commit, [lambda part: part.spark.conf.get(CODE_FACTORY)] * 3)
        self.seen.append([commit.spark.conf.get(CODE_FACTORY), *parts])
        return Outcome(applied={})


def test_a_large_batch_generates_its_code_and_a_small_one_interprets_it(spark, tmp_path):
    settings = dataclasses.replace(config.load(), lake=tmp_path / "lake", roots=(), apply_threads=3)
    session = spark.newSession()  # (the code factory set here stays off the tests' session)
    batch = Sized(settings, fencing.take(session, settings, "sized", []))
    checkpoint = catalog.checkpoint(settings, "sized")
    checkpoint.mkdir(parents=True)
    offsets(checkpoint, 0, {"t.a": {0: 30}, "t.b": {0: 20}})
    offsets(checkpoint, 1, {"t.a": {0: 130}, "t.b": {0: 20}})  # 100 records since batch 0
    offsets(checkpoint, 2, {"t.a": {0: 140}, "t.b": {0: 21}})
    records = session.range(3)  # (its size is the offsets' span: the query's, not these rows')
    for batch_id in range(3):
        batch(records, batch_id)
    assert batch.seen == [[INTERPRETED] * 4, [GENERATED] * 4, [INTERPRETED] * 4]
    batch(session.range(150), 7)  # called outside a query, no offsets logged: its rows counted
    assert batch.seen[-1] == [GENERATED] * 4
