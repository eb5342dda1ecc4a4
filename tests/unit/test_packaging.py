"""`pip install .` (not editable) gives a working `lakesync`.

The checkout is built into a wheel with the venv's own setuptools (no download), the wheel
is installed into a fresh venv that sees the project's dependencies through a .pth file
(nothing downloaded either), and its `lakesync` runs from a directory outside the
checkout, so only what the wheel holds can be imported.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("sync", "projections")
# Not sources: the build works on a copy without them (setuptools' in-tree build/ could
# hold stale modules from an earlier build, and other runs may build at the same time).
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", ".stack*", ".pytest_cache", "__pycache__",
                                     "*.egg-info", "*.pyc")
# Every service on a loopback port nothing listens on: each is refused at once.
UNREACHABLE = {
    "LAKESYNC_PG_DSN": "postgresql://x@127.0.0.1:1/x",
    "LAKESYNC_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "LAKESYNC_CONNECT_URL": "http://127.0.0.1:1",
    "LAKESYNC_SEARCH_URL": "off",
    "LAKESYNC_METRICS_PORT": "off",
}


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=120, **kwargs)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(tmp_path: Path) -> Path:
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    # --check-build-dependencies: the venv's setuptools must satisfy [build-system] requires.
    ok(run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
           "--check-build-dependencies", "--no-index", "--disable-pip-version-check", "-w", dist, source))
    (wheel,) = dist.glob("lakesync-*.whl")
    return wheel


def fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    ok(run(sys.executable, "-m", "venv", "--without-pip", venv))
    python = venv / "bin" / "python"
    site = Path(ok(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")).stdout.strip())
    # The dependencies: this interpreter's site-packages, appended after the venv's own (a
    # directory named in a .pth file does not have its own .pth files run, so the
    # editable install of the checkout stays off).
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "lakesync-test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    ok(run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
           "--disable-pip-version-check", wheel))
    return venv


def test_wheel_installs_a_working_lakesync(tmp_path):
    wheel = build_wheel(tmp_path)

    # Every package (and module) of the checkout is in the wheel.
    names = set(zipfile.ZipFile(wheel).namelist())
    for top in PACKAGE_ROOTS:
        for folder, dirs, files in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            relative = Path(folder).relative_to(ROOT).as_posix()
            if "__init__.py" in files:
                assert f"{relative}/__init__.py" in names, f"package {relative} is missing from the wheel"
            for module in (f for f in files if f.endswith(".py")):
                assert f"{relative}/{module}" in names, f"{relative}/{module} is missing from the wheel"

    venv = fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"  # not the checkout: the source tree is not on sys.path
    work.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "PGPASSFILE", "VIRTUAL_ENV")}
    env.update(UNREACHABLE, LAKESYNC_HOME=str(tmp_path / "home"))

    where = ok(run(venv / "bin" / "python", "-c", "import sync, projections; print(sync.__file__, projections.__file__)",
                   cwd=work, env=env)).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where), where

    helped = ok(run(venv / "bin" / "lakesync", "--help", cwd=work, env=env))
    assert helped.stdout.startswith("usage: lakesync")
    assert "status" in helped.stdout

    status = run(venv / "bin" / "lakesync", "status", "--json", cwd=work, env=env)
    assert "Traceback" not in status.stderr, status.stderr
    assert status.returncode == 1, f"exit {status.returncode}:\n{status.stdout}\n{status.stderr}"  # unhealthy
    report = json.loads(status.stdout)
    assert {"components", "projections"} <= set(report)
    assert report["components"]["postgres"]["ok"] is False
    assert report["components"]["kafka"]["ok"] is False
    assert report["components"]["connect"]["ok"] is False
    assert report["projections"], "the installed package lists no projection"
