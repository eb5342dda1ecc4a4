"""Whole source transactions (sync/cdc/transactions.py): what a batch applies and holds,
from END records as Debezium 3.5 writes them (checked against a live connector)."""

import json

from sync.cdc.transactions import End, Held, Rule, Seen, end_of, held_after, held_before, settle, write_held
from sync.config import COMPACTION_LAG_MS

ACCOUNTS, POSTINGS = "lakesync.public.accounts", "lakesync.public.postings"


def end_value(xid, counts):
    """An END record's value; `counts` per data collection (schema.table)."""
    return json.dumps({"schema": {}, "payload": {
        "status": "END", "id": f"{xid}:235422744", "event_count": sum(counts.values()),
        "data_collections": [{"data_collection": c, "event_count": n} for c, n in counts.items()],
        "ts_ms": 1795700773098}})


def reads(topic):
    return topic in (ACCOUNTS, POSTINGS)


def nothing_held(held):
    return not (held.ends or held.xids or held.ranges)


def seen(xid, topic, count, first, partition=0):
    return Seen(xid, topic, partition, count, first, first + count - 1)


def test_an_end_counts_only_the_tables_whose_topics_are_read():
    xid, end = end_of(7, end_value("44248", {"public.accounts": 2, "public.outbox": 2, "lakesync.heartbeat": 1}),
                      reads)
    assert (xid, end) == ("44248", End(7, {ACCOUNTS: 2}, 235422744, 1795700773098))


def test_a_transaction_whose_changes_all_came_applies():
    held = settle(Held(), [("1", End(0, {ACCOUNTS: 2, POSTINGS: 1}))],
                  [seen("1", ACCOUNTS, 2, 10), seen("1", POSTINGS, 1, 4)])
    assert nothing_held(held) and held.through.offset == 0


def test_changes_before_their_end_are_held_with_the_range_to_read_again():
    held = settle(Held(), [], [seen("1", ACCOUNTS, 2, 10), seen("1", POSTINGS, 1, 4)])
    assert held.xids == {"1"} and held.ends == {}
    assert held.ranges == {(ACCOUNTS, 0): (10, 12), (POSTINGS, 0): (4, 5)}
    # The next batch: the END, and the held changes read again.
    assert nothing_held(settle(held, [("1", End(3, {ACCOUNTS: 2, POSTINGS: 1}))],
                  [seen("1", ACCOUNTS, 2, 10), seen("1", POSTINGS, 1, 4)]))


def test_an_end_before_some_of_its_changes_waits_for_them():
    held = settle(Held(), [("1", End(0, {ACCOUNTS: 2, POSTINGS: 1}))], [seen("1", ACCOUNTS, 1, 10)])
    assert held.xids == {"1"} and held.ends == {"1": End(0, {ACCOUNTS: 2, POSTINGS: 1})}
    held = settle(held, [], [seen("1", ACCOUNTS, 1, 10), seen("1", ACCOUNTS, 1, 11), seen("1", POSTINGS, 1, 4)])
    assert nothing_held(held) and held.through == End(0, {ACCOUNTS: 2, POSTINGS: 1})


def test_a_complete_transaction_after_an_incomplete_one_is_held_too():
    """Every version reflects a prefix of the source's transactions, in commit order."""
    held = settle(Held(), [("1", End(0, {ACCOUNTS: 2})), ("2", End(1, {POSTINGS: 1})), ("3", End(2, {}))],
                  [seen("1", ACCOUNTS, 1, 10), seen("2", POSTINGS, 1, 11)])
    assert held.xids == {"1", "2", "3"} and set(held.ends) == {"1", "2", "3"}
    assert held.ranges == {(ACCOUNTS, 0): (10, 11), (POSTINGS, 0): (11, 12)}


def test_a_transaction_of_no_table_read_or_no_change_applies_at_once():
    """A heartbeat's, the outbox's alone, or an empty one (END with no count)."""
    held = settle(Held(), [("1", End(0, {})), ("2", End(1, {}))], [])
    assert nothing_held(held) and held.through == End(1, {})  # where every table stands now


def test_fifty_thousand_changes_over_batches_and_partitions():
    held = Held()
    for batch in range(5):  # 10,000 changes per batch, over two partitions
        held = settle(held, [], [seen("9", ACCOUNTS, 5_000 * (batch + 1), 0, 0),
                                 seen("9", ACCOUNTS, 5_000 * (batch + 1), 0, 1)])
        assert held.xids == {"9"}
    assert held.ranges == {(ACCOUNTS, 0): (0, 25_000), (ACCOUNTS, 1): (0, 25_000)}
    assert nothing_held(settle(held, [("9", End(0, {ACCOUNTS: 50_000}))],
                  [seen("9", ACCOUNTS, 25_000, 0, 0), seen("9", ACCOUNTS, 25_000, 0, 1)]))


def test_what_a_batch_holds_is_read_by_the_next_and_by_wait(tmp_path):
    held = Held(ends={"2": End(5, {ACCOUNTS: 3}, 900, 1)}, xids={"2", "3"}, ranges={(ACCOUNTS, 0): (40, 44)},
                through=End(4, {}, 800, 1), stopped_short=True)
    write_held(tmp_path, 7, held)
    assert held_before(tmp_path, 8) == held and held_before(tmp_path, 9) == held
    assert held_before(tmp_path, 7) == Held() and held_after(tmp_path, 7) == held and held_after(tmp_path, 6) == Held()


def test_changes_compacted_away_do_not_hold_a_transaction_when_a_later_one_came_in_their_topic():
    """A rebuild from offset zero of a compacted topic: one of 1's two changes was superseded
    by 2's change of the same key, and removed."""
    ends = [("1", End(0, {ACCOUNTS: 2})), ("2", End(1, {ACCOUNTS: 1}))]
    assert nothing_held(settle(Held(), ends, [seen("1", ACCOUNTS, 1, 10), seen("2", ACCOUNTS, 1, 12)]))
    # Without a later change in the topic, the missing one may still come: held.
    assert settle(Held(), ends[:1], [seen("1", ACCOUNTS, 1, 10)]).xids == {"1"}


class Partitions:
    """Topics of `count` partitions, of which `drained` were read to their end."""

    def __init__(self, count, drained=()):
        self.count, self.read_to_end = count, set(drained)

    def of(self, topic):
        return list(range(self.count))

    def drained(self, topic, partition):
        return (topic, partition) in self.read_to_end


def test_a_transaction_across_partitions_applies_once_every_partition_brought_its_changes():
    end = [("1", End(0, {ACCOUNTS: 3}, ts_ms=1_000))]
    held = settle(Held(), end, [seen("1", ACCOUNTS, 2, 10, partition=0)], partitions=Partitions(4), now_ms=2_000)
    assert held.xids == {"1"} and held.ranges == {(ACCOUNTS, 0): (10, 12)}
    assert nothing_held(settle(held, [], [seen("1", ACCOUNTS, 2, 10, partition=0), seen("1", ACCOUNTS, 1, 7, partition=3)],
                               partitions=Partitions(4), now_ms=2_000))


def test_changes_compacted_away_across_partitions_need_a_later_change_or_the_end_in_every_partition():
    """1 changed three keys: one in partition 0, now superseded by 2's change and compacted
    away, and two in partition 1; partitions 2 and 3 hold none of 1's."""
    ends = [("1", End(0, {ACCOUNTS: 3}, ts_ms=1_000)), ("2", End(1, {ACCOUNTS: 1}, ts_ms=1_100))]
    changes = [seen("1", ACCOUNTS, 2, 10, partition=1), seen("2", ACCOUNTS, 1, 20, partition=0)]
    old = 1_100 + COMPACTION_LAG_MS
    # A later change in partition 0 alone: 1's third change may still come in 2 or 3.
    assert settle(Held(), ends, changes, partitions=Partitions(4), now_ms=old).xids == {"1", "2"}
    # Every partition read to its end, or with a later change, and 1 older than the
    # compaction lag: nothing more of it can come.
    everything = Partitions(4, drained=[(ACCOUNTS, 1), (ACCOUNTS, 2), (ACCOUNTS, 3)])
    assert nothing_held(settle(Held(), ends, changes, partitions=everything, now_ms=old))
    # Younger than the lag, nothing was compacted: the change is still to come, held.
    assert settle(Held(), ends, changes, partitions=everything, now_ms=old - 1_000).xids == {"1", "2"}
    # A later change in every partition (2's in 1, 2, 3 too): whatever its age.
    later = changes + [seen("2", ACCOUNTS, 1, 30 + p, partition=p) for p in (1, 2, 3)]
    ends = [ends[0], ("2", End(1, {ACCOUNTS: 4}, ts_ms=1_100))]
    assert nothing_held(settle(Held(), ends, later, partitions=Partitions(4), now_ms=2_000))


# -- the ledger's rule: events of any aggregate type, counted against the sequence table --

SEQUENCE = "lakesync.public.outbox_sequence"
ACCOUNT_EVENTS, ORDER_EVENTS = "lakesync.events.account", "lakesync.events.order"
LEDGER_RULE = Rule(counted=lambda topic: topic == SEQUENCE, xid=lambda: None, sequence=lambda: None,
                   count_as=lambda topic: SEQUENCE, compacted=False)


def test_the_ledger_counts_a_transactions_events_of_every_type_against_its_sequence_changes():
    xid, end = end_of(3, end_value("7", {"public.outbox": 6, "public.outbox_sequence": 3, "public.accounts": 2}),
                      LEDGER_RULE.counted)
    assert end.counts == {SEQUENCE: 3}
    two_of_three = [seen("7", ACCOUNT_EVENTS, 2, 40)]
    held = settle(Held(), [(xid, end)], two_of_three, LEDGER_RULE)
    assert held.xids == {"7"} and held.ranges == {(ACCOUNT_EVENTS, 0): (40, 42)} and held.first is None
    # The third event is of another aggregate type, in its own topic.
    held = settle(held, [], two_of_three + [seen("7", ORDER_EVENTS, 1, 5)], LEDGER_RULE)
    assert nothing_held(held) and held.through.offset == 3 and held.first == 3


def test_a_later_transactions_event_does_not_complete_the_ledgers_earlier_one():
    """Event topics are never compacted: fewer events than END counts are never all."""
    ends = [("1", End(0, {SEQUENCE: 2})), ("2", End(1, {SEQUENCE: 1}))]
    held = settle(Held(), ends, [seen("1", ACCOUNT_EVENTS, 1, 10), seen("2", ACCOUNT_EVENTS, 1, 12)], LEDGER_RULE)
    assert held.xids == {"1", "2"} and held.through is None


def test_first_is_the_earliest_transaction_applied_that_concerns_the_projection():
    ends = [("1", End(4, {})), ("2", End(5, {ACCOUNTS: 1})), ("3", End(6, {ACCOUNTS: 1}))]
    held = settle(Held(), ends, [seen("2", ACCOUNTS, 1, 10), seen("3", ACCOUNTS, 1, 11)])
    assert (held.first, held.through.offset) == (5, 6)
    assert settle(held, [("4", End(7, {}))], []).first is None


def test_an_end_read_again_of_a_transaction_applied_before_is_ignored():
    """Kafka holding a transaction twice: its END is known by its commit LSN (its changes,
    by their previous commit, are let through by the gate: tests/spark/test_ledger_batch.py)."""
    held = settle(Held(), [("1", End(0, {ACCOUNTS: 1}, lsn=105))], [seen("1", ACCOUNTS, 1, 10)])
    assert nothing_held(held) and held.through.lsn == 105
    again = settle(held, [("1", End(9, {ACCOUNTS: 1}, lsn=105)), ("2", End(10, {ACCOUNTS: 1}, lsn=115))],
                   [seen("2", ACCOUNTS, 1, 12)])
    assert nothing_held(again) and again.through.offset == 10


def test_a_run_once_holds_every_transaction_whose_end_came_after_it_began():
    """`lakesync run --once`: each projection stops at the last transaction whose END was
    in Kafka when the run began (`until`), whatever its query read after; a later run
    applies the rest, its ENDs kept with what is held."""
    ends = [("1", End(4, {ACCOUNTS: 1})), ("2", End(7, {})), ("3", End(9, {ACCOUNTS: 1}))]
    changes = [seen("1", ACCOUNTS, 1, 10), seen("3", ACCOUNTS, 1, 11)]
    held = settle(Held(), ends, changes, until=7)
    assert held.xids == {"2", "3"} and held.through.offset == 4 and set(held.ends) == {"2", "3"}
    assert held.ranges == {(ACCOUNTS, 0): (11, 12)}
    later = settle(held, [], [seen("3", ACCOUNTS, 1, 11)])
    assert nothing_held(later) and later.through.offset == 9
