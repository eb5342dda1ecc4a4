"""Starting, finding and stopping the embedded stack's processes.

Each service runs in its own session (process group) so `down` can stop it with every
child, and records its pid under LAKESYNC_HOME/run/ so a second `up` finds it again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from sync.errors import StackError


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    hint = f"; see {log}" if log else ""
    raise StackError(f"{what} did not become ready within {timeout:.0f}s{hint}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def read_pid(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def spawn(cmd: list[str], pidfile: Path | None, logfile: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> int:
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    if pidfile is not None:
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(str(proc.pid))
    return proc.pid


def stop_pid(pid: int, timeout: float = 30.0, group: bool = True) -> None:
    """SIGTERM the process group (or, with group=False, the process alone, which stops
    its children itself), then SIGKILL the group after `timeout`."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            if group or sig == signal.SIGKILL:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not pid_alive(pid):
                return
            time.sleep(0.2)
    raise StackError(f"process {pid} did not stop")


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def require_free(host: str, port: int, what: str) -> None:
    if port_open(host, port):
        raise StackError(f"port {port} on {host} is already in use by another program; "
                         f"{what} cannot start there (free it, or point the address elsewhere)")


def service_user() -> str | None:
    """The unprivileged account to run Postgres as when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise StackError("running as root but no unprivileged 'postgres' user exists to run Postgres")


def as_user(user: str | None, cmd: list[str]) -> list[str]:
    """`cmd` run as `user` (None: as we are), through util-linux's runuser: in /usr/sbin,
    which a root shell's PATH may lack."""
    if user is None:
        return cmd
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        raise StackError(f"running as root, Postgres and OpenSearch run as '{user}' through runuser, "
                         "which is not on PATH nor in /usr/sbin: apt-get install util-linux")
    return [runuser, "-u", user, "--", *cmd]
