"""Consistent points (sync/delta/points.py): where the projections' tables stand together."""

import json
import threading
import time

import pytest

from sync.cdc.transactions import End, Held, write_held
from sync.delta.fencing import Fence
from sync.delta.points import (Point, consistent, decision, decisions, follow, meet, published, publish,
                               standing_where, together)
from sync.errors import Fenced
from sync.streaming.offsets import whole_versions_read


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


def run(tmp_path, epoch):
    """A run of the ledger holding `epoch` (its registry folder holds the epochs taken)."""
    (tmp_path / "fencing").mkdir(exist_ok=True)
    (tmp_path / "fencing" / f"{epoch:012d}").touch()
    return Fence("ledger", epoch, tmp_path / "fencing")


def test_points_are_published_per_batch_and_read_back(tmp_path):
    held = Held(through=End(7, {}, 900, 1_795_700_773_098), first=5)
    publish(tmp_path, "ledger", 3, held, {"ledger": {"path": "/lake/ledger", "version": 4}}, run(tmp_path, 1))
    publish(tmp_path, "ledger", 4, Held(), {"ledger": {"path": "/lake/ledger", "version": 4}}, run(tmp_path, 1))
    first, second = published(tmp_path, "ledger")
    assert (first.batch, first.offset, first.first, first.lsn) == (3, 7, 5, 900)
    assert first.committed_at == "2026-11-26T13:46:13.098000+00:00" and second.offset is None


def test_points_read_again_follow_a_replay_a_removal_and_batch_order(tmp_path):
    """`published` parses a point file once; a replay's rewrite and the oldest one's removal show."""
    fence = run(tmp_path, 1)
    for batch in (8, 9, 10):
        publish(tmp_path, "ledger", batch, Held(through=End(batch, {}, 100, 0)), {"ledger": {"version": batch}}, fence)
    assert [p.batch for p in published(tmp_path, "ledger")] == [8, 9, 10]
    publish(tmp_path, "ledger", 10, Held(through=End(11, {}, 100, 0)), {"ledger": {"version": 12}}, fence)
    (tmp_path / "_points" / "ledger" / "8.json").unlink()
    assert [(p.batch, p.offset, p.tables["ledger"]["version"]) for p in published(tmp_path, "ledger")] == [
        (9, 9, 9), (10, 11, 12)]


def test_a_fenced_run_publishes_no_point(tmp_path):
    """A zombie's batch that applied nothing passed no commit's fence; the versions it
    would name are the newer run's."""
    zombie, newer = run(tmp_path, 1), run(tmp_path, 2)
    publish(tmp_path, "ledger", 3, Held(through=End(7, {}, 900, 0)), {"ledger": {"version": 4}}, newer)
    with pytest.raises(Fenced):
        publish(tmp_path, "ledger", 3, Held(through=End(5, {}, 800, 0)), {"ledger": {"version": 6}}, zombie)
    assert [(p.batch, p.offset) for p in published(tmp_path, "ledger")] == [(3, 7)]


def leader_points(tmp_path, name, kept, decided=None):
    """A leader's published points, and the batch it has `decided` but not published."""
    for p in kept:
        publish(tmp_path / name, name, p.batch, Held(through=End(p.offset, {}, p.lsn, 0), first=p.first), p.tables,
                run(tmp_path, 1))
    if decided:
        batch, offset, first = decided
        write_held(tmp_path / name / "checkpoint", batch, Held(through=End(offset, {}, offset * 100, 0), first=first))
    return tmp_path / name, tmp_path / name / "checkpoint"


def test_a_follower_stops_at_the_latest_place_where_every_leader_stands(tmp_path):
    """The changelog cut at 10, 20 and 30; the mirrors, following it, at 10, 20 and 30. A
    ledger batch that would apply through 27 stops at 20; one through 24 where a leader
    does not stand there or later goes on alone."""
    leaders = {"changelog": leader_points(tmp_path, "changelog", [
                   point(1, 10, 8, "changelog"), point(2, 20, 15, "changelog"), point(3, 30, 25, "changelog")]),
               "mirrors": leader_points(tmp_path, "mirrors", [
                   point(1, 10, 9, "mirror.accounts"), point(2, 20, 11, "mirror.accounts"),
                   point(3, 30, 21, "mirror.accounts")])}
    assert follow(leaders, 10, 27, wait_seconds=0) == 20
    # Through 24: the changelog stands there, the mirrors not (their batch through 30
    # applied a transaction at 21), so 20; and after 20, nowhere: the batch goes on alone.
    assert follow(leaders, 10, 24, wait_seconds=0) == 20
    assert follow(leaders, 20, 24, wait_seconds=0) is None
    # At the leaders' last place: there.
    assert follow(leaders, 20, 30, wait_seconds=0) == 30
    # A follower with no leader point yet goes on alone.
    assert follow({**leaders, "other": (tmp_path / "other", tmp_path / "other")}, 10, 27, wait_seconds=0) is None


def test_a_leaders_decided_batch_is_where_it_will_stand_and_a_follower_does_not_wait_for_its_commit(tmp_path):
    """The changelog has published 10 and decided its batch 2 through 40 (first 12)."""
    leaders = {"changelog": leader_points(tmp_path, "changelog", [point(1, 10, 8, "changelog")], (2, 40, 12))}
    started = time.monotonic()
    assert follow(leaders, 5, 40, wait_seconds=5) == 40
    assert follow(leaders, 5, 11, wait_seconds=5) == 11  # it stands at 10 and 11: its next batch starts at 12
    assert follow(leaders, 5, 50, wait_seconds=5) == 40  # busy committing short of 50: not waited for
    assert time.monotonic() - started < 1


def test_a_follower_waits_for_a_leader_about_to_decide_and_not_for_one_catching_up(tmp_path):
    leaders = {"changelog": leader_points(tmp_path, "changelog", [point(1, 10, 8, "changelog")])}
    started = time.monotonic()
    assert follow(leaders, 10, 20, wait_seconds=0.5) is None  # it never decided past 20
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    assert follow(leaders, 15, 20, wait_seconds=5) is None  # behind 15: catching up, not waited for
    assert time.monotonic() - started < 1


def derived(batch, tables, **read):
    """A derived projection's point (the views'): `tables` and the versions it read."""
    return Point(batch=batch, lsn=None, committed_at=None, published_at=f"v{batch}",
                 tables={t: {"path": f"/lake/{t}", "version": batch} for t in tables},
                 inputs={name: {"path": f"/lake/{name}", "version": v} for name, v in read.items()})


def test_a_derived_projection_stands_where_every_table_it_read_is_at_the_version_it_read():
    """The views read the changelog at 1 and the mirrors at 1 (batch 1), then the changelog
    at 2 with the mirrors still at 1 (batch 2: no order changed). The changelog's second
    batch (version 2) applied a transaction at 15; its third made no version (an idle
    source's heartbeats), so version 2 stands on from 20 through 30."""
    log = [point(1, 10, 8, "changelog"), point(2, 20, 15, "changelog"),
           Point(batch=3, lsn=3000, committed_at="t30", published_at="p3",
                 tables={"changelog": {"path": "/lake/changelog", "version": 2}}, offset=30, first=None)]
    mirrors = [point(1, 10, 9, "mirror.orders"), point(2, 20, 12, "mirror.orders")]  # not at 30
    kept = {"mirrors": mirrors, "changelog": log}
    views = [derived(1, ["view.order_docs"], changelog=1, **{"mirror.orders": 1}),
             derived(2, ["view.order_docs"], changelog=2, **{"mirror.orders": 1})]
    # At 10 the views' batch 1 is there; at 20 the mirrors are at 2, which no views batch
    # read: no point there, nor at 30 (the mirrors' last point is at 20).
    assert places(consistent(kept, {"views": views})) == [
        (10, {"mirror.orders": 1, "changelog": 1, "view.order_docs": 1})]
    # Once the views read the mirrors at 2 (their batch 3), at 20.
    views.append(derived(3, ["view.order_docs"], changelog=2, **{"mirror.orders": 2}))
    assert places(consistent(kept, {"views": views}))[-1] == (
        20, {"mirror.orders": 2, "changelog": 2, "view.order_docs": 3})
    # The mirrors go on to 30 without changing a table (an idle batch): the views stand
    # there too, though they ran no batch (their inputs are where they read them).
    mirrors.append(Point(batch=3, lsn=3000, committed_at="t30", published_at="p3",
                         tables={"mirror.orders": {"path": "/lake/mirror.orders", "version": 2}}, offset=30))
    assert [p.offset for p in consistent(kept, {"views": views})] == [10, 20, 30]
    # A derived projection that read a table not in the points stands nowhere it is not.
    absent = [derived(1, ["view.x"], changelog=2, **{"mirror.customers": None, "mirror.orders": 2})]
    assert [p.offset for p in consistent(kept, {"views": views, "x": absent})] == [20, 30]
    assert consistent(kept, {"views": views, "x": [derived(1, ["view.x"], changelog=2, **{"mirror.customers": 4})]}) \
        == []
    # One that has published none is left out.
    assert [p.offset for p in consistent(kept, {"views": views, "event_time": []})] == [10, 20, 30]


def test_the_mirrors_point_where_the_changelog_is_at_a_version():
    log = [point(1, 10, 8, "changelog"), point(2, 20, 15, "changelog"), point(3, 30, 25, "changelog")]
    mirrors = [point(1, 10, 9, "mirror.orders"), point(2, 30, 12, "mirror.orders")]
    kept = {"changelog": log, "mirrors": mirrors}
    assert standing_where(kept, "changelog", 1).points["mirrors"].batch == 1
    assert standing_where(kept, "changelog", 2) is None  # the mirrors went from 10 to 30 in one batch
    assert standing_where(kept, "changelog", 3).points["mirrors"].batch == 2
    assert standing_where({"changelog": [], "mirrors": mirrors}, "changelog", 1) is None


def test_a_derived_batch_stands_where_its_inputs_stand_together_with_the_changelog_in_a_range():
    """The changelog at versions 1-4 (places 10-40), the ledger and the mirrors stopping
    at 10, 30 and 40: they stand together at 10, at 30 until just before 35 (the first
    transaction any of them applied next) and at 40."""
    log = [point(v, 10 * v, 10 * v - 2, "changelog") for v in (1, 2, 3, 4)]
    ledger = [point(1, 10, 9, "ledger"), point(2, 30, 25, "ledger"), point(3, 40, 35, "ledger")]
    mirrors = [point(1, 10, 9, "mirror.orders"), point(2, 30, 12, "mirror.orders"), point(3, 40, 35, "mirror.orders")]
    kept = {"changelog": log, "ledger": ledger, "mirrors": mirrors}
    # The stream read the changelog through version 4: the latest place is 40.
    assert together(kept, "changelog", 1, 4).place == 40
    # Through version 3 only, from version 1 on: 34, with every input's point there.
    found = together(kept, "changelog", 1, 3)
    assert found.place == 34 and {n: p.batch for n, p in found.points.items()} == \
        {"changelog": 3, "ledger": 2, "mirrors": 2}
    # Not before a batch's previous place, nor with the changelog before the lowest version.
    assert together(kept, "changelog", 1, 3, after=34) is None
    assert together(kept, "changelog", 4, 4).place == 40 and together(kept, "changelog", 2, 2) is None
    # A place a leader decided on comes first, though a later one exists.
    assert together(kept, "changelog", 1, 4, among=[10, 30]).place == 30
    assert together(kept, "changelog", 1, 4, among=[20]).place == 40  # (20: the mirrors went from 10 to 30)
    assert together({**kept, "mirrors": []}, "changelog", 1, 4) is None


def test_a_leaders_latest_decisions_are_read_oldest_first(tmp_path):
    for batch in range(5):
        decision(tmp_path, "views", batch, lambda b=batch: {"place": 10 * b})
    assert [d["place"] for d in decisions(tmp_path, "views", 3)] == [20, 30, 40]
    assert decisions(tmp_path, "event_time", 3) == []


def test_a_derived_projections_reading_is_decided_once_per_batch(tmp_path):
    assert decision(tmp_path, "views", 3) is None
    assert decision(tmp_path, "views", 4, lambda: {"changelog": 7}) == {"changelog": 7}
    # Its replay reads what the first attempt's commits were computed from.
    assert decision(tmp_path, "views", 4, lambda: {"changelog": 9}) == {"changelog": 7}
    assert decision(tmp_path, "views", 4) == {"changelog": 7}
    assert published(tmp_path, "views") == []  # (kept apart from the points)


def test_a_derived_projection_meets_its_inputs_where_the_changelog_is_at_the_version_it_read(tmp_path):
    """The changelog made version 2 at 20 and stands there; the ledger, behind at 10,
    publishes its point at 20 a moment later: the batch waits for it. Once the changelog
    has moved on and the ledger has gone past 20 without stopping there, it does not wait."""
    roots = {"changelog": tmp_path / "changelog", "ledger": tmp_path / "ledger"}
    leader_points(tmp_path, "changelog", [point(1, 10, 8, "changelog"), point(2, 20, 15, "changelog")])
    leader_points(tmp_path, "ledger", [point(1, 10, 9, "ledger")])
    later = threading.Timer(0.5, leader_points, (tmp_path, "ledger", [point(2, 20, 16, "ledger")]))
    later.start()
    started = time.monotonic()
    found = meet(roots, "changelog", 2, wait_seconds=10)
    later.join()
    assert (found.points["changelog"].batch, found.points["ledger"].batch) == (2, 2) and 0.4 < time.monotonic() - started < 5
    assert meet(roots, "changelog", 1, wait_seconds=10).points["ledger"].batch == 1
    leader_points(tmp_path, "changelog", [point(3, 30, 25, "changelog")])
    leader_points(tmp_path, "ledger", [point(3, 30, 18, "ledger")])  # applied 18 and stopped at 30
    leader_points(tmp_path, "changelog", [point(4, 40, 35, "changelog")])
    started = time.monotonic()
    assert meet(roots, "changelog", 3, wait_seconds=10).points["ledger"].batch == 3
    roots["mirrors"] = tmp_path / "mirrors"
    leader_points(tmp_path, "mirrors", [point(1, 10, 9, "mirror.orders"), point(2, 40, 12, "mirror.orders")])
    assert meet(roots, "changelog", 3, wait_seconds=10) is None  # the mirrors went from 10 to 40
    assert time.monotonic() - started < 2


def test_the_versions_a_batch_of_delta_streams_has_read_whole(tmp_path):
    (tmp_path / "offsets").mkdir()

    def offsets(batch, *ends):
        lines = ["v1", "{}", *(json.dumps({"sourceVersion": 1, "reservoirVersion": v, "index": i,
                                           "isStartingVersion": starting}) for v, i, starting in ends)]
        (tmp_path / "offsets" / str(batch)).write_text("\n".join(lines))
    offsets(3, (103, -1, False), (40, -1, False))
    assert whole_versions_read(tmp_path, 3, {"changelog": "/c", "ledger": "/l"}) == {
        "changelog": {"path": "/c", "version": 102}, "ledger": {"path": "/l", "version": 39}}
    offsets(4, (103, 5, False), (40, -1, False))  # inside version 103 (a trigger's file limit)
    assert whole_versions_read(tmp_path, 4, {"changelog": "/c", "ledger": "/l"}) is None
    offsets(5, (103, -1, True), (40, -1, False))  # the first snapshot
    assert whole_versions_read(tmp_path, 5, {"changelog": "/c", "ledger": "/l"}) is None
