"""A joblib sweep's workers end when its process is killed (they once ran on, adding records)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from experiments.app import parent
from tests.experiments.conftest import MEASURE_NOTHING


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_only_a_worker_process_watches_its_parent(monkeypatch):
    monkeypatch.setenv(parent.VARIABLE, "")  # put back as it was after the test
    assert not parent.in_worker()  # no launcher: a single run, or a library call
    parent.mark_launcher()
    assert not parent.in_worker()  # the launcher itself (a sweep under nohup outlives its shell)
    monkeypatch.setenv(parent.VARIABLE, str(os.getppid()))
    assert parent.in_worker()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree in /proc")
def test_kill_9_of_a_joblib_sweep_ends_its_workers_and_adds_no_record(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Two jobs side by side, each training for minutes: whatever ends them is the kill.
    process = cli.start(
        *cli.sweep_args(
            sweep_dir,
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "train.steps=5000,5001",
            "logger=none",
            "report=false",
            *MEASURE_NOTHING,
        )
    )
    deadline = time.monotonic() + 120
    while len(list(sweep_dir.glob("*/.hydra"))) < 2:  # both jobs started
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    time.sleep(1.0)  # both jobs are in the app, training
    workers = _children(process.pid)
    workers += [grandchild for child in workers for grandchild in _children(child)]
    assert len(workers) >= 2, workers
    process.kill()  # SIGKILL: no handler, no clean-up in the parent
    process.wait()
    try:
        deadline = time.monotonic() + 5
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _running(pid)], "workers outlived their parent"
        time.sleep(1.0)
        assert not list(sweep_dir.glob("*/result.json"))  # no job went on to record
    finally:
        for pid in workers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
