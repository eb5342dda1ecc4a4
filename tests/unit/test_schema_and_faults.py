"""Pure rules behind schema evolution, fencing and the runner's error reports."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import types as T

from sync.commands.runner import _raised
from sync.delta.fencing import Fence, latest_epoch, take
from sync.delta.schema import widens
from sync.errors import Fenced
from sync.streaming.stream import executor_lost


@pytest.mark.parametrize("old, new, ok", [
    (T.IntegerType(), T.LongType(), True),
    (T.ShortType(), T.IntegerType(), True),
    (T.FloatType(), T.DoubleType(), True),
    (T.DecimalType(10, 2), T.DecimalType(12, 2), True),
    (T.DecimalType(10, 2), T.DecimalType(14, 4), True),
    (T.DecimalType(12, 2), T.DecimalType(12, 4), False),   # fewer integer digits
    (T.LongType(), T.IntegerType(), False),
    (T.StringType(), T.IntegerType(), False),
    (T.IntegerType(), T.StringType(), False),
    (T.DateType(), T.TimestampNTZType(), False),           # needs the timestampNtz feature too
])
def test_only_lossless_widenings_are_applied_in_place(old, new, ok):
    assert widens(old, new) is ok


def test_a_fence_is_overtaken_by_any_higher_epoch(tmp_path: Path):
    fence = Fence("mirrors", 3, tmp_path)
    (tmp_path / "000000000003").touch()
    fence.check()
    (tmp_path / "000000000004").touch()
    assert latest_epoch(tmp_path) == 4
    with pytest.raises(Fenced, match="newer run holds epoch 4"):
        fence.check()


def test_a_closed_fence_is_not_an_epoch_and_spares_the_next_run_its_stamps(tmp_path: Path):
    settings = SimpleNamespace(lake=tmp_path, roots=())
    first = take(None, settings, "mirrors", ["<a table>"])  # the first run: nothing to fence
    first.close()
    assert latest_epoch(first.folder) == 1
    # The run before closed: no stamp, so no Spark is needed (None would fail if used).
    second = take(None, settings, "mirrors", ["<a table>"])
    assert second.epoch == 2 and sorted(p.name for p in second.folder.iterdir()) == [
        "000000000001", "000000000001.closed", "000000000002"]


def test_the_runner_finds_our_error_inside_sparks_report():
    text = ("An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
            "  File ...\nsync.errors.Fenced: projection mirrors: fenced, a newer run holds epoch 5\n")
    assert _raised(text, Fenced) == "projection mirrors: fenced, a newer run holds epoch 5"
    assert _raised("something else", Fenced) is None


def test_the_runner_tells_a_lost_executor_from_another_failure():
    # (from a batch whose localCheckpoint'ed results were on a worker killed mid-batch)
    text = ("An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
            "org.apache.spark.SparkException: [CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_3950_1 "
            "not found!\nEither the executor that originally checkpointed this partition is no longer alive, "
            "or the original RDD is unpersisted.\n")
    assert executor_lost(text) == "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"
    assert executor_lost("Job aborted: ExecutorLostFailure (executor 1 exited)") == "ExecutorLostFailure"
    assert executor_lost("[DELTA_CONCURRENT_APPEND] Files were added by a concurrent update") is None
