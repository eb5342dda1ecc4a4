"""An S3-compatible server for the tests: moto's (its pip package, pinned in
requirements.txt), on 127.0.0.1, with the AWS SDK's variables pointing at it: every
client of the lake (sync/lake.py's boto3, Spark's S3A, DuckDB's httpfs, delta-rs) finds
it as a user's would find their store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sync.stack.process import wait_until

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lakesync-tests", "AWS_SECRET_ACCESS_KEY": "lakesync-tests-secret",
               "AWS_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def s3_server(log: Path) -> Iterator[str]:
    """moto's server on a free port while the block runs, the SDK's variables set to it;
    yields its endpoint."""
    port = _free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1",
                                   "-p", str(port)], stdout=output, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {name: os.environ.get(name) for name in (*CREDENTIALS, "AWS_ENDPOINT_URL")}
    os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint})
    try:
        wait_until(lambda: _listening(port) or server.poll() is not None, 60, "moto's S3 server")
        assert server.poll() is None, f"moto's S3 server exited {server.returncode}: see {log}"
        yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.terminate()
        server.wait(timeout=30)
