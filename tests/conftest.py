"""Test session set-up shared by every test folder.

The tests get their own embedded stack (LAKESYNC_HOME=.stack-test, ports apart from a
developer's demo stack), set here before anything reads the configuration.
"""

import os
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
    "LAKESYNC_SPARK_MASTER_PORT": "27077",
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
# functions, the search sink on its own node) run in the other at the lowest CPU priority,
# which the Spark JVM and the OpenSearch node they start inherit: they take the CPU the
# end-to-end tests leave idle while they wait for the pipeline, and little from those that
# keep both cores busy (at equal priority the rebuild test took 710 s instead of 441 s).
LOCAL_NICENESS = 19


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


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start any process
def pytest_runtest_setup(item):
    if hasattr(item.config, "workerinput") and not item.get_closest_marker("e2e"):
        os.nice(LOCAL_NICENESS - os.nice(0))  # (os.nice adds to the niceness; 0 once it is there)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (Delta enabled) for every test that needs one."""
    import time

    from sync import config
    from sync.streaming import spark as spark_session

    time.tzset()
    session = spark_session.session(config.load(), "lakesync-tests", console=True)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def object_store():
    """The tests' S3-compatible server (moto's: tests/object_store.py) and its bucket
    `lake`; the AWS SDK's variables point at it while the session runs."""
    from tests.object_store import s3_server

    with s3_server(Path(os.environ["LAKESYNC_HOME"]) / "logs" / "moto.log") as endpoint:
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lake")
        yield endpoint


@pytest.fixture
def bucket_lake(spark, object_store, request):
    """A lake of the test's own in the bucket (s3a://lake/<test>), and the session's Spark
    given the S3A options a session on such a lake starts with (sync/streaming/spark.py)."""
    import re

    from sync import lake

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in lake.s3a_options().items():
        hadoop.set(key, value)
    return lake.ObjectPath("lake", re.sub(r"[^\w-]", "-", request.node.name))
