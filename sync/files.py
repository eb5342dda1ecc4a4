"""Small files the runner and the commands replace whole: progress, catalog pointers,
resnapshot notes. A reader sees the old content or the new, never half of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomically(path: Path, value: Any) -> None:
    """Write `value` as JSON to a temporary file beside `path`, then rename it over
    `path` (os.replace: atomic on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON at `path`, or `default` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default
