"""The changelog's change data feed (projections/changelog.py): what a derived batch
(the views, event time) reads again of the versions a batch before it held
(projections/derived.py)."""

import dataclasses

from delta.tables import DeltaTable

from projections import changelog
from sync import config
from sync.delta import fencing
from sync.delta.merge import ensure_table, latest_version


def rows(spark, offsets):
    return spark.createDataFrame([("public.orders", "c", str(o), None, "{}", o, o, o, None, "lakesync.public.orders", 0,
                                   o, None, None) for o in offsets], changelog.SCHEMA)


def test_the_feed_gives_the_rows_of_a_range_of_versions_from_where_it_began(spark, tmp_path):
    settings = dataclasses.replace(config.load(), lake=tmp_path / "lake")
    fence = fencing.take(spark, settings, changelog.NAME, [])
    path = changelog.changelog_path(settings)
    changelog.ensure(spark, path, fence)
    assert changelog.change_feed_from(spark, path) == 0
    for offsets in ([1, 2], [3], [4, 5, 6]):  # versions 1, 2, 3
        rows(spark, offsets).write.format("delta").mode("append").save(path)
    read = changelog.versions(spark, path, 1, 3)
    assert read.columns == DeltaTable.forPath(spark, path).toDF().columns
    assert sorted(r["_offset"] for r in read.collect()) == [3, 4, 5, 6]
    assert changelog.versions(spark, path, 3, 3).count() == 0

    # A changelog made before the feed: turned on in one commit, which it begins at.
    old = str(tmp_path / "old")
    ensure_table(spark, old, changelog.SCHEMA, {"delta.appendOnly": "true"})
    rows(spark, [1]).write.format("delta").mode("append").save(old)
    assert changelog.change_feed_from(spark, old) is None
    changelog.ensure(spark, old, fence)
    assert changelog.change_feed_from(spark, old) == latest_version(old) == 2
    rows(spark, [2, 3]).write.format("delta").mode("append").save(old)
    assert sorted(r["_offset"] for r in changelog.versions(spark, old, 2, 3).collect()) == [2, 3]
    changelog.ensure(spark, old, fence)  # (once)
    assert latest_version(old) == 3
