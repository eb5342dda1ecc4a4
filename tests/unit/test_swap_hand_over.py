"""`rebuild --swap` handed over to the running runner (sync/commands/runner.py
`hand_over_swap`): the request and answer files between two processes, the runner's side
played here by a thread in the runner's place (its pid: a process of this test's); and
the rebuild's own swap when no runner runs."""

import os
import subprocess
import sys
import threading
import time

import pytest

from projections import mirrors
from sync import config
from sync.commands import rebuild, runner
from sync.delta import catalog
from sync.errors import RunnerFailed

GENERATIONS = {"mirrors": (1, "/lake/_generations/mirrors/1")}


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    return config.load()


@pytest.fixture
def runner_process(settings):
    """A live process named by the runner's pid file: it waits on its stdin until killed."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    settings.runner_pidfile.write_text(str(process.pid))
    yield process
    process.kill()
    process.wait()
    process.stdin.close()


def play_runner(settings, answer):
    """The runner's loop, in a thread: it takes the request and calls `answer` with it."""
    def loop():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            request = runner._swap_request(settings)
            if request is not None:
                answer(request)
                return
            time.sleep(0.05)  # a poll, as the runner's loop looks for a request between its turns (every 0.5 s there)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_without_a_runner_the_rebuild_swaps_itself(settings):
    assert runner.hand_over_swap(settings, GENERATIONS) is None
    assert not settings.runner_swapfile.exists()


def test_the_runner_takes_the_request_and_its_lines_come_back(settings, runner_process):
    seen = []

    def answer(request):
        seen.append(request)
        runner._answer(settings, request, ["swap: done"])
    play_runner(settings, answer)
    assert runner.hand_over_swap(settings, GENERATIONS) == ["swap: done"]
    assert seen == [{"by": os.getpid(), "generations": {"mirrors": [1, "/lake/_generations/mirrors/1"]}}]
    assert not settings.runner_swapfile.exists() and not settings.runner_swappedfile.exists()


def test_a_runner_that_could_not_swap_fails_the_rebuild_with_its_reason(settings, runner_process):
    play_runner(settings, lambda request: runner._answer(settings, request, [], "OSError: disk full"))
    with pytest.raises(RunnerFailed, match="could not swap the new generations in: OSError: disk full"):
        runner.hand_over_swap(settings, GENERATIONS)


def test_a_runner_that_exits_before_taking_it_leaves_the_swap_to_the_rebuild(settings, runner_process):
    threading.Timer(0.5, runner_process.kill).start()
    assert runner.hand_over_swap(settings, GENERATIONS) is None
    assert not settings.runner_swapfile.exists()  # no later runner takes it


def test_a_request_whose_rebuild_has_exited_is_dropped(settings):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    settings.runner_swapfile.write_text(f'{{"by": {gone.pid}, "generations": {{}}}}')
    assert runner._swap_request(settings) is None
    assert not settings.runner_swapfile.exists()


def test_with_no_runner_the_rebuild_swaps_in_and_retires_each_generation_it_built(settings):
    (settings.lake / "_checkpoints" / "mirrors").mkdir(parents=True)
    shadow = catalog.building(settings, mirrors.NAME, 1)
    (catalog.checkpoint(shadow, mirrors.NAME)).mkdir(parents=True)
    said = []
    rebuild._swap(settings, [rebuild.Build(mirrors.PROJECTION, shadow, 1)], said.append)
    assert said == ["swap: the catalog now points mirrors at generation 1", "swap: mirrors generation 0 retired"]
    assert catalog.checkpoint(settings, mirrors.NAME) == catalog.checkpoint(shadow, mirrors.NAME)
    assert not (settings.lake / "_checkpoints" / "mirrors").exists()
    # A runner that exited mid-swap had swapped it in already: nothing is done twice.
    rebuild._swap(settings, [rebuild.Build(mirrors.PROJECTION, shadow, 1)], said.append)
    assert len(said) == 2 and catalog.checkpoint(shadow, mirrors.NAME).is_dir()
