"""Event time: windows, the watermark, lateness and emission, as pure functions.

Event time is when a business event happened, carried in the event: a posting's
`occurred_at` (the ledger's `event_time`), an order's `placed_at`, a payment's
`paid_at`. Processing time (`recorded_at`, `_applied_at`) is when we saw it; no window
here is ever cut on it.

The watermark of a stream is the greatest event time seen so far, minus a delay: "events
older than this have probably all arrived". It is computed per event, in source commit
order, as `watermark_before(e)`: the greatest event time of the events of e's stream
committed before e, minus the delay. It therefore depends on the log alone, not on
where micro-batches happen to split it nor on the wall clock, and a rebuild from offset
zero stamps every event the same way (Spark's own watermark advances per micro-batch,
so a rebuild with other batch boundaries would drop other events).

Per window [start, end) and event e in it (`classify`):
  late         watermark_before(e) >= end + allowed lateness: not counted; it goes to
               the late-events table instead (never dropped silently);
  after_final  end <= watermark_before(e) < end + allowed lateness: counted, and counted
               once more in the window's `corrections`;
  on_time      otherwise (also for a stream's first event, which has no watermark).
A window row's `emission` (`emission`) is `early` while the current watermark is below
its end, then `final`, or `correction` if an event was counted after it went final.

This module imports nothing of Spark: the streaming batch (batch.py) and the oracle
(oracle.py) call it on the driver, and the unit tests pin it on exact inputs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Callable, Iterable

# The window shapes the views are defined by (the issue fixes them; the watermark delay
# and the allowed lateness are settings, sync/config.py).
HOURLY = timedelta(hours=1)                 # tumbling volume per account
SLIDE_SIZE = timedelta(minutes=10)          # sliding windows of 10 minutes ...
SLIDE_STEP = timedelta(minutes=5)           # ... starting every 5 minutes
SESSION_GAP = timedelta(minutes=30)         # customer activity sessions
PAYMENT_BOUND = timedelta(hours=1)          # a payment counts for its order within this

ON_TIME, AFTER_FINAL, LATE = "on_time", "after_final", "late"
EARLY, FINAL, CORRECTION = "early", "final", "correction"
PENDING, PAID, UNPAID = "pending", "paid", "unpaid"

# An event's position in source commit order: (commit LSN, change LSN, topic,
# partition, offset). Snapshot rows have commit LSN 0; the tail breaks ties.
Position = tuple


def _epoch(t: datetime) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc if t.tzinfo else None)


def _floor(t: datetime, size: timedelta) -> datetime:
    return t - (t - _epoch(t)) % size


def tumbling(t: datetime, size: timedelta = HOURLY) -> list[tuple[datetime, datetime]]:
    """The one window of `size` holding t, aligned to the epoch (as Spark's `window`)."""
    start = _floor(t, size)
    return [(start, start + size)]


def sliding(t: datetime, size: timedelta = SLIDE_SIZE, step: timedelta = SLIDE_STEP) -> list[tuple[datetime, datetime]]:
    """Every window [k*step, k*step + size) holding t, earliest first (as Spark's
    `window(t, size, step)`)."""
    last = _floor(t, step)
    starts = []
    start = last
    while start + size > t:
        starts.append(start)
        start -= step
    return [(s, s + size) for s in reversed(starts)]


@dataclass(frozen=True)
class Clock:
    """A stream's progress: the greatest event time seen, and the last position seen."""

    max_event_time: datetime
    position: Position

    def watermark(self, delay: timedelta) -> datetime:
        return self.max_event_time - delay


def stamp(events: Iterable[dict], clock: Clock | None, delay: timedelta,
          max_before: Callable[[Position], datetime | None] | None = None) -> tuple[list[dict], Clock | None]:
    """Each event (a dict with `position` and `event_time`) with its `watermark_before`,
    in position order, and the clock after them.

    The events arrive as a prefix of commit order, so the greatest event time before
    an event is the clock's plus the batch's earlier events. An event at or below the
    clock's position did not (see batch.py): `max_before(position)`
    then gives the greatest event time stored before it, and the definition holds.
    """
    stamped, batch_max, running = [], None, clock.max_event_time if clock else None
    for event in sorted(events, key=lambda e: e["position"]):
        if clock is None or event["position"] > clock.position:
            before = running
        else:
            stored = max_before(event["position"]) if max_before else None
            before = max((t for t in (stored, batch_max) if t is not None), default=None)
        stamped.append({**event, "watermark_before": before - delay if before is not None else None})
        batch_max = event["event_time"] if batch_max is None else max(batch_max, event["event_time"])
        running = event["event_time"] if running is None else max(running, event["event_time"])
        if clock is None or event["position"] > clock.position:
            clock = Clock(running, event["position"])
        else:
            clock = Clock(running, clock.position)
    return stamped, clock


def classify(watermark_before: datetime | None, end: datetime, lateness: timedelta) -> str:
    if watermark_before is None or watermark_before < end:
        return ON_TIME
    return AFTER_FINAL if watermark_before < end + lateness else LATE


def emission(end: datetime, corrections: int, watermark: datetime | None) -> str:
    if watermark is None or watermark < end:
        return EARLY
    return CORRECTION if corrections > 0 else FINAL


def window_rows(entries: Iterable[dict], windows_of: Callable[[datetime], list], watermark: datetime | None,
                lateness: timedelta) -> tuple[dict[tuple, dict], list[dict]]:
    """Per (account, window start): the row of the accepted entries, and the late
    (entry, window) pairs. Entries are ledger inputs: account, currency, amount (Decimal),
    event_time, watermark_before, event_id."""
    rows: dict[tuple, dict] = {}
    late = []
    for e in entries:
        for start, end in windows_of(e["event_time"]):
            verdict = classify(e["watermark_before"], end, lateness)
            if verdict == LATE:
                late.append(late_row(e, str(e["account"]), start, end))
                continue
            row = rows.setdefault((e["account"], start), {
                "account": e["account"], "currency": e["currency"], "window_start": start, "window_end": end,
                "entries": 0, "net_amount": Decimal(0), "volume": Decimal(0), "corrections": 0})
            row["entries"] += 1
            row["net_amount"] += e["amount"]
            row["volume"] += abs(e["amount"])
            row["corrections"] += verdict == AFTER_FINAL
    for row in rows.values():
        row["emission"] = emission(row["window_end"], row["corrections"], watermark)
    return rows, late


def late_row(event: dict, key: str, start: datetime, end: datetime, view: str = "") -> dict:
    return {"view": view, "event_id": event["event_id"], "key": key, "window_start": start, "window_end": end,
            "event_time": event["event_time"], "watermark_before": event["watermark_before"],
            "_commit_lsn": event.get("_commit_lsn"), "_lsn": event.get("_lsn")}


# -- sessions --

def session_late(entry: dict, gap: timedelta, lateness: timedelta) -> bool:
    """An entry is late for sessions when the watermark had passed the end of its own
    proto-session [t, t + gap) by the allowed lateness (Beam's rule for merging windows)."""
    return classify(entry["watermark_before"], entry["event_time"] + gap, lateness) == LATE


def split_sessions(entries: Iterable[dict], gap: timedelta) -> list[list[dict]]:
    """Entries (by event time) cut where the next is more than `gap` after the previous:
    a session is [first, last + gap). As Spark's `session_window`, an entry exactly
    `gap` after the previous one still joins its session."""
    sessions: list[list[dict]] = []
    for e in sorted(entries, key=lambda e: (e["event_time"], e["position"])):
        if sessions and e["event_time"] <= sessions[-1][-1]["event_time"] + gap:
            sessions[-1].append(e)
        else:
            sessions.append([e])
    return sessions


def session_corrections(entries: Iterable[dict], gap: timedelta) -> int:
    """How many of one session's entries changed it after it (or a part of it that it
    has since merged) was final: replayed in arrival (position) order over the
    sub-sessions formed so far, an entry is a correction when it extends or merges a
    sub-session whose end its watermark had passed, or starts one that ends at or
    before its watermark."""
    starts: list[datetime] = []  # the sub-sessions so far, [start, end), disjoint and sorted
    ends: list[datetime] = []
    corrections = 0
    for e in sorted(entries, key=lambda e: e["position"]):
        t, mark = e["event_time"], e["watermark_before"]
        # The sub-sessions it touches (touching joins, as in split_sessions) are a run:
        # those starting at or before t + gap and ending at or after t.
        low, high = bisect.bisect_left(ends, t), bisect.bisect_right(starts, t + gap)
        touched = range(low, max(low, high))
        if mark is not None and (any(ends[i] <= mark for i in touched) or (not touched and t + gap <= mark)):
            corrections += 1
        start = min(t, starts[low]) if touched else t
        end = max(t + gap, ends[high - 1]) if touched else t + gap
        starts[low:max(low, high)], ends[low:max(low, high)] = [start], [end]
    return corrections


def session_rows(entries: Iterable[dict], gap: timedelta, watermark: datetime | None,
                 lateness: timedelta) -> tuple[list[dict], list[dict]]:
    """One customer's session rows from all their entries, and the late entries."""
    accepted, late = [], []
    for e in entries:
        if session_late(e, gap, lateness):
            late.append(late_row(e, str(e["customer_id"]), e["event_time"], e["event_time"] + gap))
        else:
            accepted.append(e)
    rows = []
    for session in split_sessions(accepted, gap):
        end = session[-1]["event_time"] + gap
        corrections = session_corrections(session, gap)
        rows.append({"customer_id": session[0]["customer_id"], "session_start": session[0]["event_time"],
                     "session_end": end, "last_event_at": session[-1]["event_time"], "entries": len(session),
                     "corrections": corrections, "emission": emission(end, corrections, watermark)})
    return rows, late


# -- orders joined with their payments within a time bound --

def order_row(order: dict, payments: Iterable[dict], watermark: datetime | None, lateness: timedelta,
              bound: timedelta = PAYMENT_BOUND) -> tuple[dict | None, list[dict]]:
    """An order's row of the interval left outer join, and its late events.

    The bound is placed_at <= paid_at <= placed_at + bound (pay_by), both ends
    inclusive; the window a payment is judged against is the order's [placed_at, pay_by].
    The match is the accepted in-bound payment with the lowest (paid_at, payment_id).
    With no match the order is `pending` until the watermark passes pay_by, then `unpaid`.
    """
    placed, pay_by = order["event_time"], order["event_time"] + bound
    key = str(order["order_id"])
    order_late = classify(order["watermark_before"], pay_by, lateness) == LATE
    accepted, late, corrections = [], [late_row(order, key, placed, pay_by)] if order_late else [], 0
    for p in payments:
        if not placed <= p["event_time"] <= pay_by:
            continue  # outside the bound: not part of this join
        verdict = classify(p["watermark_before"], pay_by, lateness)
        # (a payment follows its order in commit order, so a late order's are late too)
        if verdict == LATE or order_late:
            late.append(late_row(p, key, placed, pay_by))
            continue
        accepted.append(p)
        corrections += verdict == AFTER_FINAL
    if order_late:
        return None, late
    match = min(accepted, key=lambda p: (p["event_time"], p["payment_id"]), default=None)
    status = PAID if match else (UNPAID if watermark is not None and watermark >= pay_by else PENDING)
    row = {"order_id": order["order_id"], "placed_at": placed, "pay_by": pay_by,
           "payment_id": match["payment_id"] if match else None, "paid_at": match["event_time"] if match else None,
           "amount": match["amount"] if match else None,
           "time_to_pay_us": microseconds(match["event_time"] - placed) if match else None,
           "payment_status": status, "corrections": corrections,
           "emission": emission(pay_by, corrections, watermark)}
    return row, late


def microseconds(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
