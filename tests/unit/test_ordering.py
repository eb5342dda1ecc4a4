"""Source positions order changes; wall-clock time never does."""

from sync.cdc.ordering import newer_than, newer_than_literal, parse_sequence, spark_order


def test_parse_sequence():
    assert parse_sequence('["26544424","26544464"]') == (26544424, 26544464)


def test_snapshot_read_has_no_previous_commit_and_sorts_first():
    assert parse_sequence('[null,"100"]') == (0, 100)
    assert parse_sequence('[null,"100"]') < parse_sequence('["50","120"]')


def test_missing_or_malformed_sequence_is_none():
    for bad in (None, "", "[]", '["x","1"]', "not json", '["1"]'):
        assert parse_sequence(bad) is None


def test_commit_order_beats_change_lsn():
    # Transaction B committed after A, though one of its changes sits earlier in the WAL.
    a_change = parse_sequence('["1000","1500"]')
    b_change = parse_sequence('["1600","1400"]')
    assert b_change > a_change


def test_newer_than_predicate_is_explicit_for_pruning():
    predicate = newer_than("s", "t")
    assert predicate == ("(s._commit_lsn > t._commit_lsn OR "
                         "(s._commit_lsn = t._commit_lsn AND s._lsn > t._lsn))")
    assert newer_than_literal((5, 7), side="t") == "(t._commit_lsn > 5 OR (t._commit_lsn = 5 AND t._lsn > 7))"


def test_positions_sort_as_spark_orders_structs_nulls_first():
    positions = [(5, 7), (None, 9), (5, None), (4, 100), (None, None)]
    assert sorted(positions, key=spark_order) == [(None, None), (None, 9), (4, 100), (5, None), (5, 7)]
    assert max(positions, key=spark_order) == (5, 7)
