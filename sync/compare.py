"""Compare two row sets the way Postgres would: Postgres is the truth.

Every value is canonicalised by its Postgres column type (so 1.50 and 1.5, a UTC
instant and its timestamptz, a JSON text and a jsonb value compare equal), each row is
hashed, and the two sides are compared by key; a table without a key is compared as a
multiset (each distinct row with its number of copies). A `Report` has the row counts, an
order-independent content hash per side, the number of differing keys and up to
SAMPLE of them with both sides. `lakesync verify` (sync/commands/verify.py) and the
projections' own checks build their reports here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable

from sync.projection import Target

SAMPLE = 10
NULL = "\u2205"


def canonical(value: Any, pg_type: str) -> Any:
    """A JSON-able canonical form of one value; both sides of a comparison go through it."""
    if value is None:
        return NULL
    if pg_type.endswith("[]") or pg_type == "ARRAY":
        element = pg_type[:-2] if pg_type.endswith("[]") else "text"
        return [canonical(v, element) for v in value]
    if pg_type in ("numeric", "decimal", "money"):
        try:
            number = Decimal(str(value).replace("$", "").replace(",", ""))
        except ArithmeticError:  # not a number at all: compared as text (and differs)
            return str(value)
        if not number.is_finite():
            return str(number)
        return format(number.normalize(), "f")
    if pg_type == "real":
        return repr(struct.unpack("f", struct.pack("f", float(value)))[0])
    if pg_type in ("double precision",):
        return repr(float(value))
    if pg_type in ("json", "jsonb"):
        # Postgres gives JSON text, Delta a struct or array (a nested document): both become
        # plain values, numbers exact (Decimal, normalised), then one canonical JSON text.
        parsed = json.loads(value, parse_float=Decimal) if isinstance(value, str) else value
        return json.dumps(plain_value(parsed), sort_keys=True, separators=(",", ":"))
    if pg_type == "bytea":
        return bytes(value).hex()
    if pg_type == "uuid":
        return str(uuid.UUID(str(value)))
    if pg_type == "timestamp with time zone":
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if pg_type == "timestamp without time zone":
        return value.isoformat(sep=" ", timespec="microseconds")
    if pg_type == "time without time zone":
        return value.strftime("%H:%M:%S.%f") if isinstance(value, dt.time) else str(value)
    if pg_type == "interval":
        if isinstance(value, dt.timedelta):
            return str(value // dt.timedelta(microseconds=1))
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def plain_value(value: Any) -> Any:
    """A nested value (Spark Row, list, dict, Decimal, bytes) as JSON-able plain values; a
    timestamp with a zone as its UTC time without one (as Spark gives it in UTC)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=False)
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return format(value.normalize(), "f") if value.is_finite() else str(value)
    if isinstance(value, float):
        return format(Decimal(repr(value)).normalize(), "f")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return value


READABLE_WIDTH = 80  # characters of one value a difference shows in a terminal


def readable(value: Any, width: int = READABLE_WIDTH) -> Any:
    """A sample's value as a person reads it: a text longer than `width` (a 60 KB TOASTed
    value, say) cut in the middle, with its length; rows and lists value by value."""
    if isinstance(value, dict):
        return {k: readable(v, width) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [readable(v, width) for v in value]
    if isinstance(value, str) and len(value) > width:
        keep = (width - 1) // 2
        return f"{value[:keep]}\u2026{value[-keep:]} ({len(value)} characters)"
    return value


def row_digest(values: Iterable[Any]) -> bytes:
    return hashlib.sha256(json.dumps(list(values), separators=(",", ":")).encode()).digest()[:16]


@dataclass
class Report:
    name: str
    kind: str
    source_rows: int = 0
    target_rows: int = 0
    differences: int = 0
    source_hash: str = ""
    target_hash: str = ""
    sample: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "source_rows": self.source_rows,
               "target_rows": self.target_rows, "differences": self.differences,
               "source_hash": self.source_hash, "target_hash": self.target_hash, "sample": self.sample}
        if self.error:
            out["error"] = self.error
        return out


def _content_hash(digests: Iterable[bytes]) -> str:
    total = sum(int.from_bytes(d, "big") for d in digests) % (1 << 128)
    return f"{total:032x}"


def _compare_multisets(report: Report, source_rows: Iterable[tuple], target_rows: Iterable[tuple],
                       columns: list[str], types: list[str]) -> Report:
    """A table without a key: equal when every distinct row has as many copies on both sides."""
    def count(rows: Iterable[tuple]) -> tuple[Counter, dict[str, list], int]:
        copies, canonical_rows, total = Counter(), {}, 0
        for row in rows:
            total += 1
            canon = [canonical(v, t) for v, t in zip(row, types)]
            text = json.dumps(canon)
            copies[text] += 1
            canonical_rows[text] = canon
        return copies, canonical_rows, total

    source, source_canon, report.source_rows = count(source_rows)
    mirror, mirror_canon, report.target_rows = count(target_rows)
    report.source_hash = _content_hash(row_digest(source_canon[k]) for k, n in source.items() for _ in range(n))
    report.target_hash = _content_hash(row_digest(mirror_canon[k]) for k, n in mirror.items() for _ in range(n))
    for text in sorted(set(source) | set(mirror)):
        if source[text] == mirror[text]:
            continue
        report.differences += abs(source[text] - mirror[text])
        if len(report.sample) < SAMPLE:
            row = dict(zip(columns, (source_canon.get(text) or mirror_canon[text])))
            report.sample.append({"row": row, "source_copies": source[text], "target_copies": mirror[text]})
    return report


def compare(target: Target, source_rows: Iterable[tuple], target_rows: Iterable[tuple],
            columns: list[str], types: list[str], keys: list[str]) -> Report:
    """Pure comparison of two row sets given in `columns` order (unit-tested)."""
    if not keys:
        return _compare_multisets(Report(target.name, target.kind), source_rows, target_rows, columns, types)
    key_at = [columns.index(k) for k in keys]

    def index(rows: Iterable[tuple]) -> tuple[dict[str, tuple[bytes, list]], int, list[str]]:
        out, count, repeated = {}, 0, []
        for row in rows:
            count += 1
            canon = [canonical(v, t) for v, t in zip(row, types)]
            key = json.dumps([canon[i] for i in key_at])
            if key in out:
                repeated.append(key)
            out[key] = (row_digest(canon), canon)
        return out, count, repeated

    source, source_count, _ = index(source_rows)
    mirror, target_count, duplicates = index(target_rows)
    report = Report(target.name, target.kind, source_count, target_count)
    # A key held twice is a difference even when both copies are right: nothing doubled.
    report.differences += len(duplicates)
    for key in duplicates[:SAMPLE]:
        report.sample.append({"key": dict(zip(keys, json.loads(key))), "source": None,
                              "target": "duplicate row"})
    report.source_hash = _content_hash(v[0] for v in source.values())
    report.target_hash = _content_hash(v[0] for v in mirror.values())
    for key in sorted(set(source) | set(mirror)):
        left, right = source.get(key), mirror.get(key)
        if left is not None and right is not None and left[0] == right[0]:
            continue
        report.differences += 1
        if len(report.sample) < SAMPLE:
            report.sample.append({
                "key": dict(zip(keys, json.loads(key))),
                "source": dict(zip(columns, left[1])) if left else None,
                "target": dict(zip(columns, right[1])) if right else None})
    return report


def oracle_columns(conn, sql: str) -> tuple[list[str], list[str]]:
    """Column names and Postgres type names of a query's result, without running it."""
    cursor = conn.execute(f"SELECT * FROM ({sql}) AS oracle LIMIT 0")
    names = [d.name for d in cursor.description]
    oids = [d.type_code for d in cursor.description]
    types = {oid: name for oid, name in conn.execute(
        "SELECT oid, format_type(oid, NULL) FROM pg_type WHERE oid = ANY(%s)", (oids,)).fetchall()}
    return names, [types.get(oid, "text") for oid in oids]
