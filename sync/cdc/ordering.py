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


def position_columns(sequence: Column) -> tuple[Column, Column]:
    """The Spark twin of parse_sequence: (commit LSN, change LSN) as bigint columns."""
    parts = F.from_json(sequence, "array<string>")
    return F.coalesce(parts[0].cast("bigint"), F.lit(0)), parts[1].cast("bigint")


def newer_than(source: str, target: str) -> str:
    """SQL predicate: the change in `source` is later in commit order than the row in `target`.

    Written out rather than as a struct comparison so Delta can use it when pruning.
    """
    return (f"({source}._commit_lsn > {target}._commit_lsn OR "
            f"({source}._commit_lsn = {target}._commit_lsn AND {source}._lsn > {target}._lsn))")
