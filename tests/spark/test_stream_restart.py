"""A query restarts from what a killed process left in its checkpoint (real Spark)."""

import dataclasses

import pytest

from sync import config
from sync.delta import catalog
from sync.streaming.stream import run_batches

pytestmark = pytest.mark.spark


def test_a_query_killed_writing_its_first_offsets_entry_starts_again(spark, tmp_path):
    settings = dataclasses.replace(config.load(), lake=tmp_path / "lake")
    source = str(tmp_path / "source")
    spark.range(5).write.format("delta").save(source)
    # What SIGKILL during Spark's write of offsets/0 leaves: the hidden temporary file and
    # its checksum, never renamed into place (seen after a chaos run's kill).
    offsets = catalog.checkpoint(settings, "restarted") / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.07f2a94f-3d7f-4cb6-9cc9-5814276521e3.tmp").write_text('v1\n{"batchWatermarkMs":0}\n')
    (offsets / "..0.07f2a94f-3d7f-4cb6-9cc9-5814276521e3.tmp.crc").write_bytes(b"crc")
    seen = []
    query = run_batches(spark.readStream.format("delta").load(source), "restarted",
                        lambda batch, batch_id: seen.append((batch_id, batch.count())), settings, once=True)
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    assert seen == [(0, 5)]
    assert sorted(p.name for p in offsets.iterdir()) == [".0.crc", "0"]
