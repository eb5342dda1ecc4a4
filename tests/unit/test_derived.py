"""Which changelog versions a derived batch (the views, event time) applies
(projections/derived.py `versions_to_read`)."""

from projections.derived import Reading, versions_to_read


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
