"""Fault injection: LAKESYNC_FAULT=<point>[,<point>...] hard-exits the process there, as
kill -9 would; `pause_<point>` instead stops the process (SIGSTOP) the first time it
gets there, as a long GC pause or a frozen VM would, until someone sends SIGCONT.

Points are named where they are performed (sync/delta/commit.py, projections/mirrors.py).
A hard exit skips every finally block and atexit hook, so what survives is exactly what
a crash leaves.
"""

from __future__ import annotations

import os
import signal
import sys

CRASH_EXIT_CODE = 137
_paused: set[str] = set()


def crash_point(name: str, setting: str) -> None:
    points = setting.split(",") if setting else []
    if name in points:
        sys.stderr.write(f"LAKESYNC_FAULT: crashing at {name}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    if f"pause_{name}" in points and name not in _paused:
        _paused.add(name)
        sys.stderr.write(f"LAKESYNC_FAULT: pausing at {name}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
