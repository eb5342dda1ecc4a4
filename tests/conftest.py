"""Test session set-up shared by every test folder.

The tests get their own embedded stack (LAKESYNC_HOME=.stack-test, ports apart from a
developer's demo stack), set here before anything reads the configuration.
"""

import os
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_ENV = {
    "LAKESYNC_HOME": str(ROOT / ".stack-test"),
    "LAKESYNC_PG_DSN": "postgresql://lakesync_admin@127.0.0.1:25432/lakesync",
    "LAKESYNC_KAFKA_BOOTSTRAP": "127.0.0.1:29092",
    "LAKESYNC_CONNECT_URL": "http://127.0.0.1:28083",
    "LAKESYNC_SEARCH_URL": "http://127.0.0.1:29200",
    "LAKESYNC_METRICS_PORT": "29400",
    "LAKESYNC_SPARK_DRIVER_MEMORY": "2g",
    "LAKESYNC_SHUFFLE_PARTITIONS": "2",
    "TZ": "UTC",
}
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)
os.environ.pop("PGPASSFILE", None)  # the test stack's own pgpass, set by config.load()


# -- make test: two pytest-xdist workers (`-n 2 --dist loadgroup`) --------------------------
# The end-to-end tests share one stack and one runner, so they run in one worker, in the
# order tests/e2e/conftest.py gives them. The tests that need no stack (unit, Spark batch
# functions, the search sink on its own node) run in the other, beside them, once the
# rebuild test is over: that test keeps both cores busy on its own (beside it, it took
# 710 s instead of 441 s), the end-to-end tests after it mostly wait for the pipeline.
REBUILD_TEST = "tests/e2e/test_rebuild.py"
REBUILD_WAIT_SECONDS = 1800  # then the local tests start anyway (the rebuild test hangs or its worker died)
_WAITED = pytest.StashKey[bool]()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """The two groups, by folder (not by xdist_group marks: pytest 9's node ids cannot
    take the group suffix pytest-xdist 3.8 appends to them)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StackApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "stack" if nodeid.startswith("tests/e2e/") else "local"

    return StackApart(config, log)


def _rebuild_done(config) -> Path | None:
    """The file the end-to-end worker writes once the rebuild test is over (None unless
    this is a worker of an xdist run whose tests include the rebuild test)."""
    run = getattr(config, "workerinput", {}).get("testrunuid")
    return Path(tempfile.gettempdir()) / f"lakesync-tests-{run}.rebuilt" if run else None


def pytest_runtest_teardown(item, nextitem):
    done = _rebuild_done(item.config)
    if done and item.nodeid.startswith(REBUILD_TEST) and not (nextitem and nextitem.nodeid.startswith(REBUILD_TEST)):
        done.touch()


@pytest.fixture(autouse=True)
def after_the_rebuild_test(request):
    """A test needing no stack waits (once) for the rebuild test, when both run."""
    done = _rebuild_done(request.config)
    if (done and not request.node.get_closest_marker("e2e") and not request.session.stash.get(_WAITED, False)
            and any(item.nodeid.startswith(REBUILD_TEST) for item in request.session.items)):
        deadline = time.monotonic() + REBUILD_WAIT_SECONDS
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(1)  # polls another process' progress; bounded by the deadline
        request.session.stash[_WAITED] = True
        done.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (Delta enabled) for every test that needs one."""
    import time

    from sync import config
    from sync.streaming import spark as spark_session

    time.tzset()
    session = spark_session.session(config.load(), "lakesync-tests")
    yield session
    session.stop()
