"""The pure rules of event time (projections/event_time/rules.py): windows, stamps,
lateness, emission, sessions and the payment join, on exact inputs."""

import dataclasses
import random
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from projections.event_time import rules as eventtime
from projections.event_time.rules import AFTER_FINAL, CORRECTION, EARLY, FINAL, LATE, ON_TIME
from sync import config
from sync.errors import LakesyncError

T = datetime(2026, 11, 24, 10, 0)
MIN = timedelta(minutes=1)
DELAY, LATENESS = timedelta(minutes=10), timedelta(hours=1)


def at(minutes: float) -> datetime:
    return T + timedelta(minutes=minutes)


def event(n, minutes, **extra):
    return {"event_id": f"e{n}", "position": (n, n, "t", 0, n), "event_time": at(minutes), **extra}


def test_tumbling_and_sliding_membership():
    assert eventtime.tumbling(at(59) + timedelta(seconds=59, microseconds=999999)) == [(T, at(60))]
    assert eventtime.tumbling(at(60)) == [(at(60), at(120))]
    assert eventtime.sliding(at(7)) == [(at(0), at(10)), (at(5), at(15))]
    assert eventtime.sliding(at(5)) == [(at(0), at(10)), (at(5), at(15))]
    assert eventtime.sliding(at(4) + timedelta(seconds=59, microseconds=999999)) == [(at(-5), at(5)), (at(0), at(10))]


def test_stamp_is_a_running_max_by_position_not_by_batch():
    events = [event(1, 50), event(2, 20), event(3, 90), event(4, 55)]
    whole, clock = eventtime.stamp(events, None, DELAY)
    assert [e["watermark_before"] for e in whole] == [None, at(40), at(40), at(80)]
    assert clock == eventtime.Clock(at(90), (4, 4, "t", 0, 4))
    for cut in range(1, 4):
        first, middle = eventtime.stamp(events[:cut], None, DELAY)
        rest, end = eventtime.stamp(list(reversed(events[cut:])), middle, DELAY)
        assert first + rest == whole and end == clock


def test_an_event_below_the_clock_is_stamped_from_what_is_stored_before_it():
    _, clock = eventtime.stamp([event(1, 50), event(3, 90)], None, DELAY)
    stamped, after = eventtime.stamp([event(2, 20)], clock, DELAY, max_before=lambda position: at(50))
    assert stamped[0]["watermark_before"] == at(40)
    assert after == clock


def test_classify_boundaries():
    end = at(60)
    assert eventtime.classify(None, end, LATENESS) == ON_TIME
    assert eventtime.classify(end - timedelta(microseconds=1), end, LATENESS) == ON_TIME
    assert eventtime.classify(end, end, LATENESS) == AFTER_FINAL
    assert eventtime.classify(end + LATENESS - timedelta(microseconds=1), end, LATENESS) == AFTER_FINAL
    assert eventtime.classify(end + LATENESS, end, LATENESS) == LATE


def test_emission_states():
    assert eventtime.emission(at(60), 0, None) == EARLY
    assert eventtime.emission(at(60), 0, at(59)) == EARLY
    assert eventtime.emission(at(60), 0, at(60)) == FINAL
    assert eventtime.emission(at(60), 2, at(61)) == CORRECTION


def posting(n, minutes, amount, wm_minutes=None, account=1):
    return event(n, minutes, account=account, currency="EUR", amount=Decimal(amount),
                 watermark_before=at(wm_minutes) if wm_minutes is not None else None, customer_id=7)


def test_window_rows_count_corrections_and_leave_out_late_entries():
    entries = [posting(1, 5, "10.0001"), posting(2, 50, "-2.5", 0), posting(3, 30, "1", 70),
               posting(4, 40, "100", 125)]
    rows, late = eventtime.window_rows(entries, eventtime.tumbling, at(130), LATENESS)
    row = rows[(1, T)]
    assert (row["entries"], row["net_amount"], row["volume"], row["corrections"], row["emission"]) == \
        (3, Decimal("8.5001"), Decimal("13.5001"), 1, CORRECTION)
    assert [(r["event_id"], r["window_start"]) for r in late] == [("e4", T)]


def test_sessions_split_at_gap():
    gap = eventtime.SESSION_GAP
    # As Spark's session_window: exactly the gap apart still joins (checked against it in tests/spark).
    one = eventtime.split_sessions([posting(1, 0, "1"), posting(2, 30, "1")], gap)
    two = eventtime.split_sessions([posting(1, 0, "1"), posting(2, 30 + 1 / 60_000_000, "1")], gap)
    assert [len(s) for s in two] == [1, 1] and [len(s) for s in one] == [2]


def test_bridging_entry_is_a_correction_only_when_a_merged_session_was_final():
    gap = eventtime.SESSION_GAP
    # 11:40, then 12:25 (watermark 12:15 after it: [11:40, 12:10) is final), then a bridge at 12:00.
    entries = [posting(1, 100, "1"), posting(2, 145, "1", 90), posting(3, 120, "1", 135)]
    rows, late = eventtime.session_rows(entries, gap, at(135), LATENESS)
    assert late == []
    assert [(r["session_start"], r["session_end"], r["entries"], r["corrections"], r["emission"]) for r in rows] \
        == [(at(100), at(175), 3, 1, EARLY)]
    # The same bridge while both parts are still open corrects nothing.
    early = [posting(1, 100, "1"), posting(2, 145, "1", 90), posting(3, 120, "1", 100)]
    assert eventtime.session_rows(early, gap, at(135), LATENESS)[0][0]["corrections"] == 0
    # A bridge beyond the allowed lateness of its own proto-session is late and merges nothing.
    gone = [posting(1, 100, "1"), posting(2, 145, "1", 90), posting(3, 120, "1", 210)]
    rows, late = eventtime.session_rows(gone, gap, at(210), LATENESS)
    assert len(rows) == 2 and [r["event_id"] for r in late] == ["e3"]


def payment(n, minutes, pid, wm_minutes, amount="5.00"):
    return event(n, minutes, payment_id=pid, order_id=1, amount=Decimal(amount),
                 watermark_before=at(wm_minutes) if wm_minutes is not None else None)


def test_match_payment():
    order = event(1, 0, order_id=1, watermark_before=None)
    assert eventtime.order_row(order, [], at(59), LATENESS)[0]["payment_status"] == "pending"
    row, late = eventtime.order_row(order, [], at(60), LATENESS)
    assert (row["payment_status"], row["emission"], late) == ("unpaid", FINAL, [])
    # Both ends of the bound are inclusive; one after it is not part of the join.
    row, _ = eventtime.order_row(order, [payment(2, 60, 20, 0), payment(3, 61, 21, 0)], at(0), LATENESS)
    assert (row["payment_id"], row["time_to_pay_us"], row["payment_status"]) == (20, 3_600_000_000, "paid")
    # A payment after the order went final corrects it; an earlier-dated one replaces the match.
    row, _ = eventtime.order_row(order, [payment(2, 50, 20, 0), payment(3, 30, 21, 65)], at(65), LATENESS)
    assert (row["payment_id"], row["corrections"], row["emission"]) == (21, 1, CORRECTION)
    # One beyond the allowed lateness is late, and the order stays unpaid.
    row, late = eventtime.order_row(order, [payment(3, 30, 21, 120)], at(120), LATENESS)
    assert row["payment_status"] == "unpaid" and [r["event_id"] for r in late] == ["e3"]


def test_any_split_of_the_events_gives_the_same_rows():
    rng = random.Random(8)
    events = [posting(n, rng.randint(0, 300), str(rng.randint(1, 999))) for n in range(1, 60)]
    whole, _ = eventtime.stamp(events, None, DELAY)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(events)), 4))
        clock, parts = None, []
        for low, high in zip([0, *cuts], [*cuts, len(events)]):
            done, clock = eventtime.stamp(events[low:high], clock, DELAY)
            parts += done
        assert parts == whole


def test_settings_read_watermark_and_lateness(monkeypatch):
    monkeypatch.setenv("LAKESYNC_WATERMARK_DELAY_SECONDS", "30")
    monkeypatch.setenv("LAKESYNC_ALLOWED_LATENESS_SECONDS", "0")
    settings = config.load()
    assert (settings.watermark_delay_seconds, settings.allowed_lateness_seconds) == (30, 0)
    assert dataclasses.replace(settings, watermark_delay_seconds=5).watermark_delay_seconds == 5
    monkeypatch.setenv("LAKESYNC_WATERMARK_DELAY_SECONDS", "-1")
    with pytest.raises(LakesyncError, match="LAKESYNC_WATERMARK_DELAY_SECONDS"):
        config.load()
