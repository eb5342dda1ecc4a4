"""One embedded stack and one runner for the whole end-to-end session.

The stack is started from scratch with the real command (`lakesync up`); if it cannot
start, every end-to-end test errors with the reason: nothing is skipped.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from sync import config
from sync.commands.verify import verify
from sync.demo import bank
from sync.demo import schema as demo_schema
from sync.stack.background import start_background
from sync.stack.connect import render_connector
from sync.stack.process import read_pid, wait_until


def lakesync(*args, timeout=600, env=None, check=False):
    """Run the real command line; returns the CompletedProcess (text)."""
    result = subprocess.run([sys.executable, "-m", "sync", *args], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        raise AssertionError(f"lakesync {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def stack():
    settings = config.load()
    lakesync("down")
    shutil.rmtree(settings.home, ignore_errors=True)
    lakesync("up", check=True)
    demo_schema.create(settings)  # the tests' application is the demo's
    start_background(settings)
    yield settings
    lakesync("down", check=True)


def connector_compression(settings) -> str:
    """The codec the connector's producer writes its batches with (connectors/postgres-source.json)."""
    return render_connector(settings)[1]["producer.override.compression.type"]


def open_bank_accounts(engine, customers: range, name: str) -> None:
    """A customer with an account per key of `customers` (EUR for odd keys, USD for even),
    1000 deposited in each, and the house accounts: one transaction."""
    with Session(engine) as session, session.begin():
        bank.open_house_accounts(session)
        for n in customers:
            session.execute(text("INSERT INTO customers (id, name, email) VALUES (:id, :name, :email)"),
                            {"id": n, "name": f"{name} {n}", "email": f"{name.lower()}{n}@x"})
            session.execute(text("INSERT INTO accounts (id, customer_id, currency) VALUES (:id, :id, :c)"),
                            {"id": n, "c": "EUR" if n % 2 else "USD"})
            bank.deposit(session, n, Decimal("1000.0000"))


FAULT_RUNNERS: list[subprocess.Popen] = []  # started by start_runner, killed after each test


@pytest.fixture(autouse=True)
def runner_restored(request):
    """After each test, whatever it did to the runner (a fault, a pause, a stop) and
    whether it passed or not: no fault runner is left, and the session's runner runs.
    One failed fault test must not leave the tests after it waiting on nothing."""
    yield
    if "stack" not in request.fixturenames:
        return
    while FAULT_RUNNERS:
        process = FAULT_RUNNERS.pop()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # a paused runner too; its JVM with it
            process.wait(timeout=60)
    stack = request.getfixturevalue("stack")
    if read_pid(stack.runner_pidfile) is None:
        start_background(stack)


@pytest.fixture
def db(stack):
    """An autocommit connection as the database owner (tests create their own tables)."""
    with psycopg.connect(stack.pg_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def app_db(stack):
    """An autocommit connection as the application role."""
    with psycopg.connect(config.role_dsn(stack, config.ROLES["app"]), autocommit=True) as conn:
        yield conn


@pytest.fixture
def synced(stack, spark):
    """Call after writing: the freshness barrier, then verify against Postgres.

    Returns the verify reports of the named targets (every target if none is named: a
    table name means its mirror; `changelog`, `ledger` and dotted names such as
    `view.order_docs` are target names)
    and asserts that none differs.
    """
    def check(*tables, timeout=600):
        names = {t if t in ("changelog", "ledger") or "." in t else f"mirror.{t}" for t in tables} or None
        # The barrier for the projections keeping the named targets (every one if none is
        # named) returns as soon as they are fresh; the timeout only bounds a failure. A
        # views batch waits for the mirrors' batch first: minutes under load.
        barrier = lakesync("wait", *sorted(names or ()), "--timeout", str(timeout), timeout=timeout + 60, check=True)
        assert "WARN" not in barrier.stdout + barrier.stderr, barrier.stderr  # (no JVM line: issue 23)
        reports = verify(stack, spark=spark, only=names)
        assert reports, "verify compared nothing"
        bad = [r.as_json() for r in reports if r.differences]
        assert not bad, json.dumps(bad, indent=2, default=str)
        return {r.name: r for r in reports}
    return check


def start_runner(settings, fault):
    """A runner in its own process with LAKESYNC_FAULT set; returns it once it runs, or
    once the fault fired (a backlog, the views' for one, can reach the fault's point
    before the runner has started all its queries). Its output goes to
    <home>/logs/runner-<fault>.log."""
    log = settings.logs / f"runner-{fault}.log"
    # No metrics endpoint: a paused runner would keep the port from the run that replaces
    # it, which, on another host as a real zombie would be, has a port of its own.
    env = {**os.environ, "LAKESYNC_FAULT": fault, "LAKESYNC_METRICS_PORT": "off", "PYTHONPATH": str(config.ROOT)}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "sync", "run"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    process.log = log
    FAULT_RUNNERS.append(process)
    wait_until(lambda: read_pid(settings.runner_pidfile) == process.pid or process.poll() is not None,
               180, "the faulty runner", log)
    fired = process.poll() is not None and f"LAKESYNC_FAULT: crashing at {fault}" in log.read_text()
    assert process.poll() is None or fired, f"the runner exited during start-up:\n{log.read_text()[-3000:]}"
    return process


def pytest_collection_modifyitems(items):
    """The rebuild test first among the end-to-end tests: it replays every topic from
    offset zero, and the history is shortest at the start of the session (on two cores,
    minutes less than at the end). The tests after it run on the swapped-in generations.
    The event-time test last but one: its event times, two days ahead, move the watermarks,
    after which every posting another test made would be late for its windows. The readers'
    test last: by then every kind of table exists."""
    rebuild = [item for item in items if item.path.name == "test_rebuild.py"]
    last = [item for name in ("test_event_time.py", "test_readers.py") for item in items
            if item.path.name == name and item.path.parent.name == "e2e"]
    rest = [item for item in items if item not in rebuild and item not in last]
    first_e2e = next((n for n, item in enumerate(rest) if item.path.parent.name == "e2e"), len(rest))
    after_e2e = max((n + 1 for n, item in enumerate(rest) if item.path.parent.name == "e2e"), default=len(rest))
    items[:] = rest[:first_e2e] + rebuild + rest[first_e2e:after_e2e] + last + rest[after_e2e:]
