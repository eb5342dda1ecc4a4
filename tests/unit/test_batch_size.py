"""A Kafka batch's size from its query's offsets log."""

import json

from sync.streaming.offsets import BatchPartitions


def offsets(checkpoint, batch, ends):
    """Batch `batch`'s offsets log: `ends` {topic: {partition: next offset}} of its one source."""
    (checkpoint / "offsets").mkdir(exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0}),
             json.dumps({topic: {str(p): o for p, o in parts.items()} for topic, parts in ends.items()})]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


def test_a_batch_spans_the_offsets_since_the_batch_before_it(tmp_path):
    offsets(tmp_path, 0, {"t.a": {0: 40}, "t.b": {0: 10, 1: 5}})
    assert BatchPartitions(None, tmp_path, 0).records() == 55  # a first batch: from offset 0
    offsets(tmp_path, 1, {"t.a": {0: 100}, "t.b": {0: 10, 1: 5}, "t.c": {0: 7}})
    assert BatchPartitions(None, tmp_path, 1).records() == 60 + 7  # t.c is new: from 0


def test_a_batch_whose_previous_log_is_gone_counts_from_offset_zero(tmp_path):
    offsets(tmp_path, 250, {"t.a": {0: 900}})
    assert BatchPartitions(None, tmp_path, 250).records() == 900


def test_a_batch_function_called_outside_a_query_has_no_size_from_offsets(tmp_path):
    assert BatchPartitions(None, tmp_path, 3).records() is None
