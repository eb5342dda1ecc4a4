"""The search-index sink against a real OpenSearch node: external versions make it idempotent.

One node for the session, in its own temporary home, on a port apart from the demo
stack's. If it cannot start, every test here errors with the node's log tail: a sink
test that silently skips would hide exactly the failure it exists for.
"""

import json
import os
import shutil
import sys
import tempfile
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from sync import config, search
from sync.errors import StackError
from sync.stack.opensearch import OpenSearch

TEST_PORT = 29210  # transport on 29310; the test stack's node uses 29200, the demo stack's 19200

MAPPINGS = {"dynamic": "strict", "properties": {
    "name": {"type": "keyword"},
    "qty": {"type": "integer"},
    # double indexes a rounded copy for range queries; _source keeps the exact digits.
    "amount": {"type": "double"},
}}


@pytest.fixture(scope="session")
def opensearch_url():
    # mkdtemp makes a 0700 root-owned folder; the node runs as an unprivileged account
    # when we are root and must traverse it (pytest's own tmp folders are 0700 too).
    home = Path(tempfile.mkdtemp(prefix="lakesync-search-"))
    os.chmod(home, 0o755)
    node = OpenSearch(home, config.load().jars, TEST_PORT)
    try:
        seconds = node.start()
        print(f"\nOpenSearch node ready in {seconds:.1f}s at {node.url}", file=sys.stderr)
        yield node.url
    finally:
        node.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def index(opensearch_url, request):
    """A fresh index per test, named after it: tests isolate themselves by their own index."""
    name = "t-" + request.node.name.lower().replace("_", "-")[:60]
    assert search.ensure_index(opensearch_url, name, MAPPINGS)
    return name


def doc(key, version, deleted=False, **source):
    return {"id": key, "version": version, "deleted": deleted, "source": source}


def test_index_documents(opensearch_url, index):
    result = search.push(opensearch_url, index, [doc(k, 10 + k, name=f"n{k}", qty=k) for k in range(3)])
    assert result == {"indexed": 3, "deleted": 0, "skipped": 0, "requests": 1}
    assert search.count(opensearch_url, index) == 3
    stored = search.get(opensearch_url, index, 2)
    assert stored["_version"] == 12 and stored["_source"] == {"name": "n2", "qty": 2}


def test_replayed_batch_is_a_no_op(opensearch_url, index):
    batch = [doc(k, 100, name=f"n{k}") for k in range(4)] + [doc(9, 100, deleted=True)]
    first = search.push(opensearch_url, index, batch)
    again = search.push(opensearch_url, index, batch)
    # external_gte accepts an equal version: the replay succeeds instead of conflicting.
    assert first == again == {"indexed": 4, "deleted": 1, "skipped": 0, "requests": 1}
    assert search.count(opensearch_url, index) == 4
    stored = search.get(opensearch_url, index, 3)
    assert stored["_version"] == 100 and stored["_source"] == {"name": "n3"}


def test_older_version_is_skipped_and_newer_kept(opensearch_url, index):
    search.push(opensearch_url, index, [doc("a", 5, name="new")])
    result = search.push(opensearch_url, index, [doc("a", 4, name="old"), doc("b", 1, name="b")])
    assert result == {"indexed": 1, "deleted": 0, "skipped": 1, "requests": 1}
    stored = search.get(opensearch_url, index, "a")
    assert stored["_version"] == 5 and stored["_source"] == {"name": "new"}


def test_delete_with_newer_version_and_its_tombstone(opensearch_url, index):
    search.push(opensearch_url, index, [doc("x", 1, name="x"), doc("y", 7, name="y")])
    result = search.push(opensearch_url, index, [doc("x", 2, deleted=True), doc("y", 6, deleted=True)])
    assert result == {"indexed": 0, "deleted": 1, "skipped": 1, "requests": 1}
    assert search.get(opensearch_url, index, "x") is None
    assert search.get(opensearch_url, index, "y")["_version"] == 7  # an older delete changes nothing
    # The delete's tombstone holds version 2: a late index of version 1 cannot revive x.
    late = search.push(opensearch_url, index, [doc("x", 1, name="x")])
    assert late["skipped"] == 1 and search.get(opensearch_url, index, "x") is None
    assert search.count(opensearch_url, index) == 1


def test_decimal_round_trips_exactly(opensearch_url, index):
    amount = Decimal("12345678901234.5678")
    assert float(amount) != amount  # the value a float round trip would corrupt
    search.push(opensearch_url, index, [doc("m", 1, amount=amount, qty=1)])
    with urllib.request.urlopen(f"{opensearch_url}/{index}/_source/m") as response:
        raw = response.read().decode()
    assert json.loads(raw, parse_float=str)["amount"] == "12345678901234.5678"  # the same number text
    assert search.get(opensearch_url, index, "m")["_source"]["amount"] == amount


def test_batches_hold_at_most_batch_size(opensearch_url, index):
    result = search.push(opensearch_url, index, (doc(k, 1, qty=k) for k in range(7)), batch_size=3)
    assert result == {"indexed": 7, "deleted": 0, "skipped": 0, "requests": 3}
    assert search.count(opensearch_url, index) == 7


def test_other_item_errors_raise(opensearch_url, index):
    with pytest.raises(search.SearchError, match=r"'bad'.*mapper_parsing_exception|'bad'.*strict"):
        search.push(opensearch_url, index, [doc("good", 1, qty=1), doc("bad", 1, qty=1, unknown="field")])
    assert search.get(opensearch_url, index, "good") is not None  # the rest of the batch stays written
    with pytest.raises(search.SearchError, match="index_not_found"):
        search.push(opensearch_url, "t-never-created", [doc(1, 1, qty=1)])


def test_port_in_use_is_refused(opensearch_url, tmp_path):
    with pytest.raises(StackError, match=f"port {TEST_PORT} .* already in use"):
        OpenSearch(tmp_path, config.load().jars, TEST_PORT).start()


def test_exact_json_encoding():
    text = search.to_json({"a": Decimal("0.10"), "b": [Decimal("-1E+3"), 1.5, None, "é"]})
    assert text == '{"a":0.10,"b":[-1E+3,1.5,null,"\\u00e9"]}'
    assert json.loads(text, parse_float=Decimal)["a"] == Decimal("0.10")
    with pytest.raises(search.SearchError):
        search.to_json(Decimal("NaN"))
