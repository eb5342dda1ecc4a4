"""Postgres from Debian's packages, with its own data directory under LAKESYNC_HOME.

Logical decoding needs `wal_level=logical` and room for a replication slot and its
walsender. Passwords go in LAKESYNC_HOME/pgpass (libpq's PGPASSFILE), never in a DSN.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import psycopg

from sync.config import ADMIN_ROLE, Settings, read_secrets
from sync.errors import ServiceUnavailable, StackError
from sync.stack.process import as_user, port_open, require_free, service_user, wait_until

SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "wal_sender_timeout": "60s",
    "shared_buffers": "256MB",
    "max_connections": "100",
    "timezone": "UTC",
    "log_min_messages": "warning",
}


def pg_connect(settings: Settings, **kwargs) -> psycopg.Connection:
    """A connection to the source database (ours or the team's own); unreachable: one line."""
    try:
        return psycopg.connect(settings.pg_dsn, connect_timeout=5, **kwargs)
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "unreachable"
        raise ServiceUnavailable(f"Postgres is unreachable at {settings.pg_host}:{settings.pg_port}: {reason}") from None


def binaries() -> Path:
    """The bin/ folder of the newest installed server; installs it with apt-get if absent."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if not found:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise StackError("Postgres is not installed; install Debian's 'postgresql' package "
                             "(apt-get install postgresql) or point LAKESYNC_PG_DSN at a server")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"]):
            if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
                raise StackError(f"could not install Postgres: {' '.join(cmd)} failed")
        return binaries()
    return Path(found[-1]).parent


class Postgres:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.dir = settings.home / "postgres"
        self.data = self.dir / "data"
        self.socket_dir = self.dir / "run"
        self.log = settings.logs / "postgres.log"

    def running(self) -> bool:
        return port_open(self.settings.pg_host, self.settings.pg_port)

    def ours_running(self) -> bool:
        return (self.data / "postmaster.pid").exists() and self.running()

    def start(self) -> None:
        if self.ours_running():
            return
        require_free(self.settings.pg_host, self.settings.pg_port, "Postgres")
        bin_dir = binaries()
        user = service_user()
        self._init(bin_dir, user)
        options = " ".join(f"-c {k}={v}" for k, v in {
            **SERVER_SETTINGS, "port": str(self.settings.pg_port),
            "unix_socket_directories": str(self.socket_dir)}.items())
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        if user:
            shutil.chown(self.log, user)
        result = subprocess.run(as_user(user, [str(bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                                               "-w", "-t", "60", "-o", options, "start"]),
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise StackError(f"Postgres did not start: {result.stderr.strip() or result.stdout.strip()}; "
                             f"see {self.log}")
        wait_until(self.running, 30, "Postgres", self.log)
        self._create_database()

    def stop(self) -> None:
        if not (self.data / "postmaster.pid").exists():
            return
        user = service_user()
        subprocess.run(as_user(user, [str(binaries() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)

    def _init(self, bin_dir: Path, user: str | None) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        password = read_secrets(self.settings)["admin_password"]
        pwfile = self.dir / "initdb.pw"
        pwfile.write_text(password + "\n")
        if user:
            for path in (self.dir, self.data, self.socket_dir, pwfile):
                shutil.chown(path, user, user)
            self._check_reachable(user)
        os.chmod(self.data, 0o700)
        result = subprocess.run(as_user(user, [
            str(bin_dir / "initdb"), "-D", str(self.data), "-U", ADMIN_ROLE, f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256", "--auth-local=peer", "--encoding=UTF8", "--locale=C.UTF-8"]),
            capture_output=True, text=True)
        pwfile.unlink()
        if result.returncode != 0:
            raise StackError(f"initdb failed: {result.stderr.strip()}")
        # Replication connections (Debezium's walsender) over TCP need their own line.
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 scram-sha-256\n")

    def _check_reachable(self, user: str) -> None:
        probe = subprocess.run(as_user(user, ["test", "-w", str(self.data)]))
        if probe.returncode != 0:
            raise StackError(f"Postgres runs as '{user}', who cannot reach {self.data}; "
                             "set LAKESYNC_HOME to a folder every user can traverse")

    def _create_database(self) -> None:
        s = self.settings
        with psycopg.connect(host=s.pg_host, port=s.pg_port, user=ADMIN_ROLE, dbname="postgres",
                             autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (s.pg_database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{s.pg_database}"')
