"""Which changelog versions a derived batch (the views, event time) applies
(projections/derived.py `versions_to_read`), and when it may hold some for its next batch."""

from dataclasses import replace

from projections.changelog import NAME as CHANGELOG
from projections.derived import Reading, _next_version, versions_to_read
from sync import config
from sync.cdc.transactions import End, Held, write_held
from sync.delta import catalog, points
from sync.delta.fencing import Fence


def reading(**changes):
    return Reading(ledger={"path": "/lake/ledger", "version": 3}, entries_from=0, entries_before=0, inputs=None,
                   **changes)


def test_a_batch_that_stops_before_its_streams_end_reads_what_it_applies_again():
    # The stream read versions 6-9, the batch stands at version 7: 6 and 7 from the feed.
    assert versions_to_read(reading(changes_after=5, changes_through=7, streamed=9, streamed_before=5)) == \
        ((5, 7), False)
    # The next one, stream 10-12: the held 8-9 and its stream's batch.
    assert versions_to_read(reading(changes_after=7, changes_through=12, streamed=12, streamed_before=9)) == \
        ((7, 9), True)
    # Stopped again before its end, further than the held versions.
    assert versions_to_read(reading(changes_after=7, changes_through=10, streamed=12, streamed_before=9)) == \
        ((7, 10), False)
    # Or at the very version it stopped at before (it stands still).
    assert versions_to_read(reading(changes_after=7, changes_through=7, streamed=12, streamed_before=9)) == \
        ((7, 7), False)


def test_a_batch_that_held_nothing_and_stops_at_its_streams_end_reads_its_stream_alone():
    assert versions_to_read(reading(changes_after=9, changes_through=12, streamed=12, streamed_before=9)) == \
        (None, True)
    # A decision of an earlier Lakesync, or a stream's batch ending inside a version.
    assert versions_to_read(reading()) == (None, True)
    assert versions_to_read(reading(changes_after=9, streamed_before=9)) == (None, True)
    # One inside a version after a batch that held versions: those, and the stream's.
    assert versions_to_read(reading(changes_after=7, streamed_before=9)) == ((7, 9), True)


def test_a_next_changelog_version_is_sure_once_there_or_once_the_changelog_has_decided_a_change(tmp_path):
    """A derived batch holds what its streams read only if a next batch is sure to come
    (projections/derived.py `_next_version`): the changelog has a version after the one
    read, or has decided, after the batch that made it, a batch that applies a change."""
    settings = replace(config.load(), roots=((CHANGELOG, str(tmp_path)),))
    log = tmp_path / "changelog" / "_delta_log"
    log.mkdir(parents=True)
    for version in range(4):
        (log / f"{version:020d}.json").touch()
    (tmp_path / "fencing").mkdir()
    (tmp_path / "fencing" / f"{1:012d}").touch()
    fence = Fence(CHANGELOG, 1, tmp_path / "fencing")
    checkpoint = catalog.checkpoint(settings, CHANGELOG)

    def published(batch, version):
        points.publish(tmp_path, CHANGELOG, batch, Held(through=End(batch * 10, {}, batch * 100, 0), first=batch * 10),
                       {CHANGELOG: {"path": str(tmp_path / "changelog"), "version": version}}, fence)

    def decided(batch, first):
        write_held(checkpoint, batch, Held(through=End(batch * 10, {}, batch * 100, 0), first=first))

    assert not _next_version(settings, 3, wait_seconds=0)  # idle: nothing decided
    published(4, 2)
    decided(5, 50)
    assert not _next_version(settings, 3, wait_seconds=0)  # the batch deciding is the one that made 3
    published(5, 3)
    assert not _next_version(settings, 3, wait_seconds=0)
    decided(6, None)
    assert not _next_version(settings, 3, wait_seconds=0)  # a heartbeat's batch: no change, no version
    decided(7, 70)
    assert _next_version(settings, 3, wait_seconds=0)
    assert _next_version(settings, 2, wait_seconds=0)  # a version after it is there
