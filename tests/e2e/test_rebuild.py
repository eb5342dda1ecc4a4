"""Rebuilds from offset zero on the whole stack, while the live projections run under load.

A writer keeps changing customers, orders, order lines and accounts (the views' random
workload, plus bank transfers for the ledger) through every rebuild. Each projection
kind is rebuilt beside the live one and `--verify` must find the two identical at the
same source position: the ledger and its balances; the customer history (SCD2), the
enriched ledger (temporal join), the order summary (join view) and the order documents;
every mirror (one of them with key changes that leave TOASTed values alone, a column
added with a default, a column renamed and one dropped); the event-time inputs,
windows, sessions and join (whose watermarks, taken per event in commit order, must not
depend on where either run's batches split). The views, the mirrors and event time are
then swapped in by the running runner, and the tests after this one run on them.
Postgres has the last word: barrier, then verify of every projection.
"""

import random
import re
import string
import threading
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from projections import mirrors
from sync import config
from sync.delta import catalog
from sync.demo import bank
from sync.stack.process import read_pid
from tests.e2e.conftest import lakesync
from tests.e2e.test_views import Workload

pytestmark = pytest.mark.e2e

ACCOUNTS = range(661000, 661004)  # keys no other test uses
EXPECTED = {
    "ledger": ["ledger", "ledger.balances"],
    "views": ["history.customers", "ledger.enriched", "view.customer_order_summary", "view.order_docs"],
    "mirrors": ["mirror.accounts", "mirror.customers", "mirror.keychanges", "mirror.order_items", "mirror.orders",
                "mirror.products"],
    # (late.event_time is compared too, but this workload makes no late event: it is empty)
    "event_time": ["event_time.inputs", "window.account_hourly", "window.account_sliding",
                   "window.customer_sessions", "join.order_payments"],
}
ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)$")


class Writer(threading.Thread):
    """Workload steps and bank transfers, one transaction each, until told to stop."""

    def __init__(self, settings):
        super().__init__(daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self):
        engine = bank.engine(config.role_dsn(self.settings, config.ROLES["app"]))
        try:
            with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
                workload = Workload(conn, seed=9)
                while not self.stop.is_set():
                    workload.step()
                    if self.transactions % 3 == 0:
                        source, target = ACCOUNTS[self.transactions % 4], ACCOUNTS[(self.transactions + 1) % 4]
                        with Session(engine) as session, session.begin():
                            bank.transfer(session, source, target, Decimal("1.2500"))
                    self.transactions += 1
                    self.stop.wait(0.5)  # pacing: a steady trickle, not a flood, on two cores
        except BaseException as error:  # re-raised by the test
            self.error = error
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def accounts(stack):
    engine = bank.engine(config.role_dsn(stack, config.ROLES["app"]))
    with Session(engine) as session, session.begin():
        bank.open_house_accounts(session)
        for n in ACCOUNTS:
            session.execute(text("INSERT INTO customers (id, name, email) VALUES (:id, :name, :email)"),
                            {"id": n, "name": f"Rebuild {n}", "email": f"rebuild{n}@x"})
            session.execute(text("INSERT INTO accounts (id, customer_id, currency) VALUES (:id, :id, 'EUR')"),
                            {"id": n})
            bank.deposit(session, n, Decimal("1000.0000"))
    engine.dispose()


def compared(output: str) -> dict[str, tuple[int, int, int]]:
    """rebuild --verify's table: name -> (live rows, rebuilt rows, differences)."""
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in map(ROW.match, output.splitlines()) if m}


def key_changes_and_an_added_default(settings):
    """A table whose rows' keys change, leaving TOASTed values (text, arrays) alone (one
    change alone, others inside a larger transaction, one key changed twice in it), and
    that gains a column with a default after its rows were written: Debezium sends
    neither the values nor the default for those rows (sync/delta/keychanges.py,
    sync/delta/schema.py). Then a column is renamed and another dropped (migration 0009):
    a rebuild reads the records from before the rename under the old name."""
    # Random text does not compress, so Postgres stores it out of line (TOAST).
    rng = random.Random(11)
    rows = [(n, "".join(rng.choices(string.ascii_letters, k=6000)),
             ["".join(rng.choices(string.ascii_letters, k=100)) for _ in range(60)],
             [rng.randrange(-2**31, 2**31) for _ in range(3000)]) for n in range(1, 41)]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.keychanges (id bigint PRIMARY KEY, body text, tags text[], counts int[], "
                     "n int, gone text DEFAULT 'x')")
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO public.keychanges VALUES (%s, %s, %s, %s, 0)", rows)
        conn.execute("ALTER TABLE public.keychanges ADD COLUMN flag text DEFAULT 'dflt'")
        conn.execute("UPDATE public.keychanges SET id = id + 100000 WHERE id = 1")
        with conn.transaction():
            conn.execute("UPDATE public.keychanges SET n = n + 1 WHERE id BETWEEN 2 AND 5")
            conn.execute("UPDATE public.keychanges SET id = id + 100000 WHERE id BETWEEN 2 AND 20")
            conn.execute("UPDATE public.keychanges SET id = id + 100000 WHERE id = 100003")
            conn.execute("INSERT INTO public.keychanges (id, body, n) VALUES (41, 'short', 1)")
        conn.execute('ALTER TABLE public.keychanges RENAME COLUMN n TO "times changed"')
        conn.execute("ALTER TABLE public.keychanges DROP COLUMN gone")
        conn.execute("UPDATE public.keychanges SET flag = 'set', \"times changed\" = 2 WHERE id = 100005")


def test_every_kind_rebuilt_under_load_equals_the_live_one_and_the_mirrors_swap_in(stack, accounts, synced):
    # Its live mirror is not checked on its own: the rebuild's verify finds it identical to
    # the rebuilt one at one source position, and the barrier at the end finds that one
    # (swapped in) equal to Postgres.
    key_changes_and_an_added_default(stack)
    old_mirror = Path(mirrors.mirror_path(stack, "customers"))
    runner = read_pid(stack.runner_pidfile)
    writer = Writer(stack)
    writer.start()
    try:
        # The views and the mirrors side by side (one pause of capture for both), swapped in.
        for names, extra in ((["ledger"], []), (["views", "mirrors", "event_time"], ["--swap"])):
            before = writer.transactions
            result = lakesync("rebuild", *names, "--verify", *extra, timeout=1800)
            (stack.logs / f"rebuild-{'-'.join(names)}.log").write_text(result.stdout + result.stderr)
            assert result.returncode == 0, f"rebuild {names}:\n{result.stdout}\n{result.stderr}"
            assert "verify: the rebuilt projection is identical" in result.stdout, result.stdout
            tables = compared(result.stdout)
            for name in names:
                assert f"  {name}: " in result.stdout and " read in " in result.stdout, result.stdout
                for table in EXPECTED[name]:
                    live, rebuilt, differences = tables[table]
                    assert live > 0 and live == rebuilt and differences == 0, (table, result.stdout)
            # The workload ran on while these were rebuilt (and while capture paused).
            assert writer.transactions > before + 10, (names, before, writer.transactions)
    finally:
        writer.stop.set()
        writer.join(timeout=60)
    assert writer.error is None, writer.error

    # The swap: the running runner swapped them in itself (sync/commands/runner.py
    # `hand_over_swap`), and runs on, the same process; readers resolve the mirrors and the
    # views in generation 1; generation 0 is retired.
    assert "swap: the runner's queries started again" in result.stdout, result.stdout
    assert runner is not None and read_pid(stack.runner_pidfile) == runner
    assert all(catalog.entry(stack, name)["generation"] == 1 for name in (mirrors.NAME, "views", "event_time"))
    new_mirror = Path(mirrors.mirror_path(stack, "customers"))
    assert new_mirror != old_mirror and (new_mirror / "_delta_log").is_dir() and not old_mirror.exists()
    assert not (catalog.checkpoint(stack, mirrors.NAME).parent.parent == stack.lake)
    # The runner went on from the new generation's checkpoint: everything equals Postgres.
    synced()


def test_rebuild_refuses_what_it_cannot_do(stack):
    for args, message in ((["nothing"], "no projection or target named 'nothing'"),
                          (["changelog"], "the changelog is the bronze record"),
                          (["ledger", "--swap"], "the ledger is never replaced")):
        result = lakesync("rebuild", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
