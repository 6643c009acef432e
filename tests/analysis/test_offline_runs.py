"""W&B offline runs read back from their transaction logs, as experiments.tracking writes them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from analysis import offline_runs
from experiments import tracking
from tests.conftest import WANDB_LOGGER

RUN_CONFIG = {"attention": {"name": "lsh", "n_hashes": 2}, "seq_len": 256}
RECORD = {"status": "ok", "attention": "lsh", "seq_len": 256, "attn_fwd_ms": 1.25}


@pytest.fixture(autouse=True)
def _isolated_wandb(wandb_home):
    """Every test here talks to a real offline W&B, isolated by tests/conftest.py."""


def start(out_dir, run_config=RUN_CONFIG):
    return tracking.start_tracker(
        WANDB_LOGGER,
        run_config=run_config,
        group="s1",
        job_type="bench",
        tags=[],
        name="job-0",
        out_dir=out_dir,
    )


def test_reader_agrees_with_wandb_leet_across_blocks(tmp_path):
    """A 70 KB config record spans three 32 KiB blocks; W&B's own Go reader must agree."""
    config = {**RUN_CONFIG, "blob": "x" * 70_000}
    tracker = start(tmp_path, config)
    for step in range(200):
        tracker.log_step({f"metric_{i}": step + i / 10 for i in range(20)}, step=step)
    tracker.finish(RECORD, exit_code=3)
    run = offline_runs.read_offline_run(tracker.run_dir)
    assert run["config"] == config and len(run["history"]) == 201

    inspect = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(tracker.run_dir)]
    done = subprocess.run(
        [*inspect[:5], "--summary", *inspect[5:]],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    if "No such command" in done.stderr:
        pytest.skip("this wandb has no `wandb leet inspect`")
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    assert theirs["config"] == config and theirs["exit_code"] == 3
    assert {k: v for k, v in theirs["summary"].items() if not k.startswith("_")} == run["summary"]
    done = subprocess.run(
        inspect, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=True
    )
    kinds = [json.loads(line)["type"] for line in done.stdout.splitlines()]
    assert kinds.count("history") == len(run["history"])


def test_reader_stops_at_a_torn_write(tmp_path):
    tracker = start(tmp_path)
    for step in range(5):
        tracker.log_step({"loss": float(step)}, step=step)
    tracker.finish(RECORD, exit_code=0)
    (log_file,) = tracker.run_dir.glob("run-*.wandb")
    torn = tmp_path / "torn" / log_file.name
    torn.parent.mkdir()
    shutil.copyfile(log_file, torn)
    whole = log_file.stat().st_size
    with torn.open("r+b") as handle:  # a crash mid-write leaves part of the last record
        handle.truncate(whole - 5)
    run = offline_runs.read_offline_run(torn.parent)
    assert run["config"] == RUN_CONFIG and run["exit_code"] is None  # the exit record is torn
    assert [row["step"] for row in run["history"] if "step" in row] == [0, 1, 2, 3, 4]
    with torn.open("r+b") as handle:
        handle.truncate(whole // 2)
    assert len(offline_runs.read_offline_run(torn.parent)["history"]) < 5
    (tmp_path / "bad.wandb").write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        offline_runs.read_offline_run(tmp_path / "bad.wandb")
