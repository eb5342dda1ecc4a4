"""Small files the runner and the commands replace whole: progress, catalog pointers,
resnapshot notes. A reader sees the old content or the new, never half of it."""

from __future__ import annotations

import json
from typing import Any

from sync import lake
from sync.lake import LakePath


def write_json_atomically(path: LakePath, value: Any) -> None:
    """Write `value` as JSON over `path`, whole (sync/lake.py `replace_text`)."""
    lake.replace_text(path, json.dumps(value))


def read_json(path: LakePath, default: Any = None) -> Any:
    """The JSON at `path`, or `default` when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default
