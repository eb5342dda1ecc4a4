"""The search-index sink: documents into OpenSearch through the `_bulk` API, externally versioned.

A document is `{"id": ..., "version": int, "deleted": bool, "source": {...}}`. `version`
is the document's source position (any integer that grows with commit order, e.g. the
commit LSN), never a wall-clock time and never a counter kept by the sink.

Why `version_type=external_gte`: the index, not the sink, keeps the per-key guard of
commit order. OpenSearch accepts an operation only when its version
is greater than or equal to the one it holds for that id, so

- a replayed batch (a crash after the bulk request, before the offsets commit) re-sends
  the same versions: accepted and rewritten identically, a no-op in effect;
- an older version arriving late (a redelivery, a rebuild racing the live sink) is
  refused with 409 `version_conflict_engine_exception`: the index keeps the newer
  document and we count the item as skipped, because refusing it is the point;
- a delete carries its version too and leaves a versioned tombstone, so an older
  index action cannot bring the document back. OpenSearch keeps tombstones for the
  index setting `index.gc_deletes` only (60s by default); `ensure_index` sets it to
  match the lake's tombstone horizon (LAKESYNC_TOMBSTONE_HOURS, 7 days), beyond which no
  replay can bring older records back.

`external` (strictly greater) would refuse the replay as a conflict, which is
indistinguishable from a real regression; `external_gte` makes the replay succeed.

Numbers are written exactly: a Decimal goes out as its own digits as a JSON number
(`12345678901234.5678`), never through float, and `_source` keeps the request's text, so
a reader parsing `_source` with Decimal gets the same value back. The field's mapping
decides what is indexed for search (a `double` field indexes a rounded copy; map money as
`keyword` to search it exactly); `_source` is exact either way.

Plain HTTP with urllib from the standard library: the embedded node has no security
plugin, and the sink needs no client package.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sync.errors import LakesyncError, ServiceUnavailable

BATCH_SIZE = 500
TIMEOUT = 60.0
# Matches Settings.tombstone_hours' default: tombstones live as long as in the lake.
DEFAULT_INDEX_SETTINGS = {"index.gc_deletes": "7d", "index.number_of_replicas": 0}


class SearchError(LakesyncError):
    """OpenSearch refused a request or a document for a reason other than a stale version."""


# -- JSON with exact decimals ------------------------------------------------------------

def to_json(value: Any) -> str:
    """JSON text in which a Decimal is written as its own digits, as a number.

    The json module can only write a Decimal after turning it into a float (rounding
    12345678901234.5678) or into a string; so containers are walked here and everything
    else is left to json.dumps.
    """
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise SearchError(f"{value} is not a JSON number")
        return str(value)  # 1E+3 and 0E-8 are valid JSON numbers too
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(key))}:{to_json(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(to_json(item) for item in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        raise SearchError(f"{value} is not a JSON number")
    if isinstance(value, (datetime, date)):
        return json.dumps(value.isoformat())
    return json.dumps(value)


# -- HTTP ---------------------------------------------------------------------------------

def _request(url: str, method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
    """One HTTP call; returns (status, body) for any answer, raises only when unreachable."""
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", data=body, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        raise ServiceUnavailable(f"OpenSearch is unreachable at {url} ({error})") from None


def _reason(raw: bytes) -> str:
    try:
        error = json.loads(raw).get("error", raw.decode(errors="replace"))
    except ValueError:
        return raw.decode(errors="replace")[:500]
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('reason')}"
    return str(error)


def _quote(name: str) -> str:
    return urllib.parse.quote(str(name), safe="")


# -- index management and reads ------------------------------------------------------------

def ensure_index(url: str, index: str, mappings: dict, settings: dict | None = None) -> bool:
    """Create `index` with `mappings` unless it exists; True when this call created it.

    An existing index is left as it is (its mappings are not compared or updated):
    changing a mapping means a new index and a rebuild, not an edit.
    """
    body = {"settings": {**DEFAULT_INDEX_SETTINGS, **(settings or {})}, "mappings": mappings}
    status, raw = _request(url, "PUT", f"/{_quote(index)}", to_json(body).encode())
    if status == 200:
        return True
    if status == 400 and b"resource_already_exists_exception" in raw:
        return False  # created meanwhile, by us earlier or by another writer: fine
    raise SearchError(f"creating index {index} failed ({status}): {_reason(raw)}")


def healthy(url: str) -> bool:
    """The node answers and its cluster can serve (yellow: replicas unassigned, fine)."""
    try:
        status, raw = _request(url, "GET", "/_cluster/health")
    except ServiceUnavailable:
        return False
    return status == 200 and json.loads(raw).get("status") in ("green", "yellow")


def drop_index(url: str, index: str) -> None:
    """Delete `index` with every document in it (nothing to do when it does not exist)."""
    status, raw = _request(url, "DELETE", f"/{_quote(index)}")
    if status not in (200, 404):
        raise SearchError(f"deleting index {index} failed ({status}): {_reason(raw)}")


def count(url: str, index: str) -> int:
    """Live documents in `index`. Refreshes first so every acknowledged write is counted
    (a helper for tests and checks, not for a hot path)."""
    for method, path in (("POST", f"/{_quote(index)}/_refresh"), ("GET", f"/{_quote(index)}/_count")):
        status, raw = _request(url, method, path)
        if status != 200:
            raise SearchError(f"{method} {path} failed ({status}): {_reason(raw)}")
    return int(json.loads(raw)["count"])


def get(url: str, index: str, doc_id: Any) -> dict | None:
    """The stored document (`_id`, `_version`, `_source`, ...) or None when absent or deleted.

    Real-time (no refresh needed); `_source` is parsed with Decimal for non-integers, so
    an exact decimal written by `push` comes back as the same Decimal.
    """
    status, raw = _request(url, "GET", f"/{_quote(index)}/_doc/{_quote(doc_id)}")
    if status == 404 and b'"found":false' in raw.replace(b" ", b""):
        return None
    if status != 200:
        raise SearchError(f"reading {index}/{doc_id} failed ({status}): {_reason(raw)}")
    return json.loads(raw, parse_float=Decimal)


def scan(url: str, index: str, sort: str, page: int = 1000) -> Iterator[dict]:
    """Every live document's `_source` (Decimal for non-integers), in `sort` order, page by
    page with `search_after`; nothing when the index does not exist."""
    status, raw = _request(url, "POST", f"/{_quote(index)}/_refresh")
    if status == 404:
        return
    after = None
    while True:
        body = {"size": page, "sort": [{sort: "asc"}], **({"search_after": after} if after else {})}
        status, raw = _request(url, "POST", f"/{_quote(index)}/_search", to_json(body).encode())
        if status != 200:
            raise SearchError(f"searching {index} failed ({status}): {_reason(raw)}")
        hits = json.loads(raw, parse_float=Decimal)["hits"]["hits"]
        if not hits:
            return
        for hit in hits:
            yield hit["_source"]
        after = hits[-1]["sort"]


# -- the sink ---------------------------------------------------------------------------

def _batches(docs: Iterable[dict], size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _action_lines(index: str, doc: dict) -> list[str]:
    version = doc.get("version")
    # bool is an int in Python; a True version is a bug upstream, not version 1.
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise SearchError(f"document {doc.get('id')!r} has no usable version ({version!r}); "
                          "external versions are non-negative integers")
    if doc.get("id") is None:
        raise SearchError(f"a document without an id cannot be versioned: {doc!r}")
    meta = {"_index": index, "_id": str(doc["id"]), "version": version, "version_type": "external_gte"}
    if doc.get("deleted"):
        return [to_json({"delete": meta})]
    return [to_json({"index": meta}), to_json(doc.get("source") or {})]


def push(url: str, index: str, docs: Iterable[dict], batch_size: int = BATCH_SIZE) -> dict:
    """Write `docs` in order, at most `batch_size` per `_bulk` request.

    Returns {"indexed": n, "deleted": n, "skipped": n, "requests": n}; `skipped` counts
    documents the index refused because it already holds a newer version.

    Per batch:
    1. one NDJSON body: an `index` action and its source, or a `delete` action, each with
       `version` and `version_type=external_gte`
    2. POST /_bulk; a request-level failure (malformed body, node down) raises before any
       item is judged: nothing in the batch may be assumed written
    3. per item: 2xx counts by its action; 409 (a newer version is stored) is skipped;
       a delete answered 404 `not_found` counts as deleted (the document was already
       gone, and its versioned tombstone is now recorded); any other status raises
       SearchError naming the document (a mapping error, a missing index: the node
       refuses to create one on the fly), after the whole batch was sent. Items of the
       same batch that succeeded stay written; a retry of the batch is safe because of
       step 1's versioning.

    Ids are sent as text (OpenSearch ids are strings): a key 7 and "7" are one document.
    """
    totals = {"indexed": 0, "deleted": 0, "skipped": 0, "requests": 0}
    path = f"/{_quote(index)}/_bulk"
    for batch in _batches(docs, batch_size):
        lines = [line for doc in batch for line in _action_lines(index, doc)]
        status, raw = _request(url, "POST", path, ("\n".join(lines) + "\n").encode(),
                               content_type="application/x-ndjson")
        totals["requests"] += 1
        if status != 200:
            raise SearchError(f"bulk request to {index} failed ({status}): {_reason(raw)}")
        items = json.loads(raw)["items"]
        if len(items) != len(batch):  # answers pair with documents by position only
            raise SearchError(f"bulk request to {index} answered {len(items)} items for {len(batch)} documents")
        failures = []
        for doc, item in zip(batch, items):
            action, result = next(iter(item.items()))
            code = result.get("status", 0)
            error = result.get("error") or {}
            if 200 <= code < 300:
                totals["indexed" if action == "index" else "deleted"] += 1
            elif code == 409 and error.get("type") == "version_conflict_engine_exception":
                totals["skipped"] += 1
            elif action == "delete" and code == 404 and result.get("result") == "not_found":
                totals["deleted"] += 1
            else:
                failures.append(f"{action} {doc['id']!r} v{doc['version']}: {code} "
                                f"{error.get('type')}: {error.get('reason')}")
        if failures:
            more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
            raise SearchError(f"OpenSearch refused {len(failures)} of {len(batch)} documents in {index}: "
                              + "; ".join(failures[:5]) + more)
    return totals
