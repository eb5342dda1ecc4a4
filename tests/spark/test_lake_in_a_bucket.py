"""A lake in a bucket (LAKESYNC_LAKE=s3a://...; sync/lake.py) on moto's S3 server
(tests/object_store.py): Lakesync's own files as objects, fencing's epochs claimed by
conditional PUT, the readers of `verify` and of a swap on the bucket. The mirrors' and
the ledger's batches on a bucket: tests/spark/test_mirror_batch.py and
tests/spark/test_ledger_batch.py (their `bucket` cases); the whole runner under faults:
tests/chaos."""

import dataclasses

import boto3
import pytest

from projections import mirrors
from sync import config, lake
from sync.delta import catalog, fencing, reader
from sync.errors import Fenced, ServiceUnavailable
from tests.spark.test_mirror_batch import batch, event, mirror, new_batch

pytestmark = pytest.mark.spark


@pytest.fixture
def settings(bucket_lake):
    return dataclasses.replace(config.load(), lake=bucket_lake)


def keys_under(root: lake.ObjectPath) -> set[str]:
    """Every object's key under `root`, relative to it, as another S3 client lists them."""
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=root.bucket, Prefix=f"{root.key}/")
    return {found["Key"][len(root.key) + 1:] for page in pages for found in page.get("Contents", [])}


def test_objects_behave_as_the_files_lakesync_keeps(object_store, bucket_lake):
    folder = bucket_lake / "_points" / "mirrors"
    assert not folder.exists() and list(folder.iterdir()) == [] and not folder.is_dir()
    lake.replace_text(folder / "7.json", '{"batch": 7}')
    lake.replace_text(folder / "7.json", '{"batch": 7, "again": true}')  # replaced whole
    (folder / "decisions" / "3.json").write_text("{}")
    boto3.client("s3").put_object(Bucket=folder.bucket, Key=f"{folder.key}/", Body=b"")  # S3A's folder marker
    assert folder.is_dir() and (folder / "7.json").is_file() and not (folder / "decisions").is_file()
    assert (folder / "7.json").read_text() == '{"batch": 7, "again": true}'
    assert sorted(p.name for p in folder.iterdir()) == ["7.json", "decisions"]
    assert [p.name for p in folder.glob("[0-9]*.json")] == ["7.json"]
    assert (folder / "7.json").stat().st_size == len('{"batch": 7, "again": true}')
    listed = next(folder.glob("7.json")).stat()
    assert listed == (folder / "7.json").stat()
    lake.replace_text(folder / "7.json", '{"batch": 7, "again": 1234}')  # as large, within the second
    assert (folder / "7.json").stat().st_ino != listed.st_ino  # (the points' cache tells them apart)
    with pytest.raises(FileNotFoundError):
        (folder / "8.json").read_text()
    with pytest.raises(FileNotFoundError):
        (folder / "8.json").unlink()
    (folder / "8.json").unlink(missing_ok=True)
    (folder / "claimed").touch(exist_ok=False)
    with pytest.raises(FileExistsError):  # If-None-Match: *
        (folder / "claimed").touch(exist_ok=False)
    lake.remove_tree(folder)
    assert keys_under(bucket_lake) == set() and not folder.exists()
    # A bucket that is not there: one line a user can act on, not boto's traceback.
    with pytest.raises(ServiceUnavailable, match=r"^the lake's store refused get_object of s3a://no-such-bucket/"
                                                 r"lake/_catalog/mirrors.json: The specified bucket does not exist$"):
        (lake.at("s3a://no-such-bucket/lake") / "_catalog" / "mirrors.json").read_text()


def test_runs_that_claim_the_same_epoch_get_one_each_and_the_older_is_fenced(spark, settings, monkeypatch):
    first = fencing.take(spark, settings, mirrors.NAME, [])
    # Two runs starting at once both see epoch 1 as the latest and ask for 2: the bucket
    # creates it for one, and the conditional PUT of the other fails, which takes 3.
    monkeypatch.setattr(fencing, "latest_epoch", lambda folder: 1)
    second, third = (fencing.take(spark, settings, mirrors.NAME, []) for _ in range(2))
    monkeypatch.undo()
    assert (first.epoch, second.epoch, third.epoch) == (1, 2, 3)
    assert {"_fencing/mirrors/000000000001", "_fencing/mirrors/000000000002",
            "_fencing/mirrors/000000000003"} <= keys_under(settings.lake)
    for zombie in (first, second):
        with pytest.raises(Fenced, match="a newer run holds epoch 3"):
            zombie.check()
    third.check()


def test_verify_reads_a_mirror_in_the_bucket_and_a_swap_retires_the_old_generation(spark, settings):
    new_batch(spark, settings)(batch(spark, [event("c", 1, 10, 11, "a", "1.00"), event("c", 2, 10, 12, "b", "2.00"),
                                             event("d", 2, 20, 21), event("u", 1, 30, 31, "a2", "1.50")]), 0)
    path = str(mirrors.mirror_path(settings, "widgets"))
    assert path == f"s3a://{settings.lake.bucket}/{settings.lake.key}/mirrors/widgets"
    assert {"mirrors/widgets/_delta_log/00000000000000000000.json", "_progress/mirrors.json",
            "_fencing/mirrors/000000000001"} <= keys_under(settings.lake)
    # DuckDB's delta extension (verify's reader) reads it from the bucket through httpfs.
    duck = reader.connect()
    assert list(reader.rows(duck, path, ["id", "name", "_op"])) == [(1, "a2", "u")]
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "a2"}
    # A rebuild's generation in the bucket, swapped in; generation 0's mirrors go.
    rebuilt = catalog.building(settings, mirrors.NAME, 1)
    new_batch(spark, rebuilt)(batch(spark, [event("c", 1, 40, 41, "rebuilt", "1.00")]), 0)
    old = catalog.swap(settings, mirrors.NAME, 1, catalog.root(rebuilt, mirrors.NAME))
    catalog.retire(settings, mirrors.PROJECTION, old)
    assert str(mirrors.mirror_path(settings, "widgets")).startswith(f"{settings.lake}/_generations/mirrors/1/")
    assert not any(key.startswith(("mirrors/", "_fencing/mirrors/", "_checkpoints/mirrors/"))
                   for key in keys_under(settings.lake))
    assert {k: r["name"] for k, r in mirror(spark, settings).items()} == {1: "rebuilt"}
    duck.close()
