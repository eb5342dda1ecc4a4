"""Consistent points (sync/delta/points.py): where the projections' tables stand together."""

from sync.cdc.transactions import End, Held
from sync.delta.points import Point, consistent, published, publish


def point(batch, offset, first, table):
    return Point(batch=batch, lsn=offset * 100, committed_at=f"t{offset}", published_at=f"p{batch}",
                 tables={table: {"path": f"/lake/{table}", "version": batch}}, offset=offset, first=first)


MIRRORS = [point(1, 10, 8, "mirror.accounts"), point(2, 20, 15, "mirror.accounts"),
           point(3, 30, 25, "mirror.accounts")]


def places(found):
    return [(p.offset, {name: t["version"] for name, t in p.tables.items()}) for p in found]


def test_a_point_is_where_every_projection_stands_with_each_tables_version_there():
    ledger = [point(1, 12, 11, "ledger"), point(2, 28, 26, "ledger")]
    # Not beyond 28, where the ledger has got to; not 10, before the ledger's first point.
    assert places(consistent({"mirrors": MIRRORS, "ledger": ledger})) == [
        (12, {"mirror.accounts": 1, "ledger": 1}), (20, {"mirror.accounts": 2, "ledger": 1})]
    found = consistent({"mirrors": MIRRORS, "ledger": ledger})[-1]
    assert (found.batch, found.lsn, found.committed_at, found.published_at) == (2, 2000, "t20", "p2")


def test_a_projection_does_not_stand_where_its_next_batch_applied_a_transaction_before():
    """The ledger's second batch applied a transaction at 18: at 20 its first version lacks it."""
    ledger = [point(1, 12, 11, "ledger"), point(2, 28, 18, "ledger")]
    assert places(consistent({"mirrors": MIRRORS, "ledger": ledger})) == [(12, {"mirror.accounts": 1, "ledger": 1})]


def test_a_batch_that_applied_nothing_of_a_projection_leaves_it_standing():
    ledger = [point(1, 12, 11, "ledger"), point(2, 20, None, "ledger")]
    assert places(consistent({"mirrors": MIRRORS, "ledger": ledger}))[-1] == (20, {"mirror.accounts": 2, "ledger": 2})


def test_one_projection_alone_stands_at_each_of_its_points_and_one_without_points_is_left_out():
    assert [p.offset for p in consistent({"mirrors": MIRRORS, "ledger": []})] == [10, 20, 30]
    assert consistent({"mirrors": [], "ledger": []}) == []


def test_points_are_published_per_batch_and_read_back(tmp_path):
    held = Held(through=End(7, {}, 900, 1_795_700_773_098), first=5)
    publish(tmp_path, "ledger", 3, held, {"ledger": {"path": "/lake/ledger", "version": 4}})
    publish(tmp_path, "ledger", 4, Held(), {"ledger": {"path": "/lake/ledger", "version": 4}})
    first, second = published(tmp_path, "ledger")
    assert (first.batch, first.offset, first.first, first.lsn) == (3, 7, 5, 900)
    assert first.committed_at == "2026-11-26T13:46:13.098000+00:00" and second.offset is None
