"""The runner as a background process: started by `demo`, the bench and the tests;
stopped between batches by `down` and `resnapshot` (`rebuild --swap` hands its swap to
the running runner instead: sync/commands/runner.py); and the JVM a killed runner left
behind, reaped before a new run starts."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from sync.config import ROOT, Settings
from sync.errors import RunnerFailed
from sync.stack.process import pid_alive, read_pid, spawn, stop_pid, wait_until


def start_background(settings: Settings) -> int:
    """Start `lakesync run` as a background process (unless one runs); returns its pid."""
    pid = read_pid(settings.runner_pidfile)
    if pid:
        return pid
    log = settings.logs / "runner.log"
    pid = spawn([sys.executable, "-m", "sync", "run"], None, log,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_until(lambda: _started_or_dead(settings, pid, log), 180, "the runner", log)
    return pid


def stop_background(settings: Settings, timeout: float = 120) -> bool:
    """Stop a running runner between batches; True if one ran.

    SIGTERM goes to the runner alone: it stops its queries, closes its fences, and its
    Spark JVM exits after it. A signal to the whole process group would reach the JVM
    too, whose shutdown hook stops Spark under the queries. SIGKILL after `timeout`."""
    pid = read_pid(settings.runner_pidfile)
    if pid:
        stop_pid(pid, timeout=timeout, group=False)
    return pid is not None


def _started_or_dead(settings: Settings, pid: int, log) -> bool:
    if not pid_alive(pid):
        raise RunnerFailed(f"the runner exited during start-up; see {log}")
    return read_pid(settings.runner_pidfile) == pid


def reap_orphaned_jvm(settings: Settings) -> None:
    """Kill the Spark JVM a dead runner left behind, before a new run starts.

    A runner killed with SIGKILL leaves its JVM running until the JVM notices its stdin
    closed, and then it shuts its queries down gracefully. Meanwhile its queries may still
    write the next entry of their offset logs, and a new run writing the same entry fails
    with "multiple streaming jobs detected". Its Python half is gone, so it cannot commit
    a batch: killing it loses nothing. The file names the JVM and its runner; the JVM is
    killed only when that runner is dead (a paused runner is left to the fencing tokens)
    and the pid still is a Spark JVM (pids are reused).
    """
    try:
        jvm, runner = (int(pid) for pid in settings.runner_jvm_pidfile.read_text().split())
    except (OSError, ValueError):
        jvm = runner = 0
    if jvm and pid_alive(jvm) and not pid_alive(runner):
        try:
            command = Path(f"/proc/{jvm}/cmdline").read_bytes()
        except OSError:
            command = b""
        if b"org.apache.spark.deploy.SparkSubmit" in command:
            os.kill(jvm, signal.SIGKILL)
            wait_until(lambda: not pid_alive(jvm), 30, f"the exit of a dead runner's JVM (pid {jvm})")
    settings.runner_jvm_pidfile.unlink(missing_ok=True)
