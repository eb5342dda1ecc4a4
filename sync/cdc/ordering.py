"""Source positions: what orders changes (never wall-clock time).

Debezium's `source.sequence` is the JSON text of a two-element array of decimal strings:
[LSN of the last transaction committed before this one, LSN of this change]. Postgres
decodes transactions in commit order, so the first element grows from one transaction
to the next and the second orders changes within a transaction. `source.lsn` alone does
not: concurrent transactions interleave their changes in the WAL.

A snapshot read has no previous commit (null first element); it orders before every
streamed change of its key, which the stream guarantees by starting at the snapshot.
"""

from __future__ import annotations

import json

from pyspark.sql import Column
from pyspark.sql import functions as F

Position = tuple[int, int]


def parse_sequence(sequence: str | None) -> Position | None:
    """(commit LSN, change LSN) from `source.sequence`; None if it is missing or malformed."""
    if not sequence:
        return None
    try:
        first, second = json.loads(sequence)
        return (int(first) if first is not None else 0, int(second))
    except (ValueError, TypeError):
        return None


def spark_order(position: tuple[int | None, ...]) -> tuple:
    """A sort key that orders positions as Spark orders the struct of their fields (as
    `max` of a struct column does): field by field, a null before any value."""
    return tuple((value is not None, value or 0) for value in position)


def position_columns(sequence: Column) -> tuple[Column, Column]:
    """The Spark twin of parse_sequence: (commit LSN, change LSN) as bigint columns."""
    parts = F.from_json(sequence, "array<string>")
    return F.coalesce(parts[0].cast("bigint"), F.lit(0)), parts[1].cast("bigint")


def later(first: tuple[str, str], second: tuple[str, str]) -> str:
    """SQL predicate: position `first` (its commit LSN and change LSN, as SQL expressions)
    comes after position `second` in commit order. The one place the rule is written;
    spelled out rather than as a struct comparison, so that Delta's data skipping can use
    it where it is a condition on the target alone (the backfill's UPDATE)."""
    (commit, lsn), (other_commit, other_lsn) = first, second
    return f"({commit} > {other_commit} OR ({commit} = {other_commit} AND {lsn} > {other_lsn}))"


def newer_than(source: str, target: str) -> str:
    """SQL predicate: the change in `source` is later in commit order than the row in `target`."""
    return later((f"{source}._commit_lsn", f"{source}._lsn"), (f"{target}._commit_lsn", f"{target}._lsn"))


def newer_than_literal(position: Position, side: str = "") -> str:
    """SQL predicate: the row (of `side`, if given) is later than a literal position."""
    prefix = f"{side}." if side else ""
    return later((f"{prefix}_commit_lsn", f"{prefix}_lsn"), (str(int(position[0])), str(int(position[1]))))


def parse_lsn(text: str) -> int:
    """'0/1A2B3C' -> integer LSN."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)
