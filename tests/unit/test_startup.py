"""What a command's start imports: `wait` and `status` run many times a minute (the
tests' barriers, a user's scripts), and Alembic and SQLAlchemy were about half of their
start (0.5 of 1.0 CPU-s, docs/benchmark.md): only `up` migrates, and only an application
emitting outbox events needs SQLAlchemy."""

from __future__ import annotations

import subprocess
import sys

from sync.config import ROOT

# The modules `lakesync wait` and `lakesync status` import (sync/cli.py), then which of the
# slow libraries got imported with them.
PROBE = """
import sys
from sync import cli
cli.parser()
from sync.commands import freshness, status
from sync.stack import migrate
from sync import outbox
print(sorted(m for m in ("alembic", "sqlalchemy") if m in sys.modules))
"""


def test_wait_and_status_start_without_alembic_or_sqlalchemy():
    found = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
