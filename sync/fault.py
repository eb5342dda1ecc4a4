"""Fault injection: LAKESYNC_FAULT=<point> hard-exits the process there, as kill -9 would.

Points are named where they are performed (sync/delta/commit.py). A hard exit skips
every finally block and atexit hook, so what survives is exactly what a crash leaves.
"""

from __future__ import annotations

import os
import sys

CRASH_EXIT_CODE = 137


def crash_point(name: str, setting: str) -> None:
    if setting and name in setting.split(","):
        sys.stderr.write(f"LAKESYNC_FAULT: crashing at {name}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
