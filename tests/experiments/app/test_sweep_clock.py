"""The sweep's progress: a line per job with how far the sweep is and the time left."""

from __future__ import annotations

import json
import os
import time

import pytest

from experiments.app import sweep_clock


@pytest.mark.parametrize(
    "overrides, size, keys",
    [
        (["attention=full,lsh", "seed=0,1,2"], 6, ["attention", "seed"]),
        (["attention=full,lsh", "attention=lsh"], 1, []),  # a later override of a key wins
        (["+experiment=scaling", "seq_len=range(256,1024,256)"], 3, ["seq_len"]),
        (["seq_len=1024"], 1, []),
    ],
)
def test_the_sweep_size_is_the_product_of_the_swept_values(overrides, size, keys):
    assert sweep_clock.sweep_size(overrides) == (size, keys)


def test_each_job_says_how_far_the_sweep_is_and_what_is_left(tmp_path, monkeypatch):
    clock = sweep_clock.SweepClock(tmp_path)
    job = ["attention=full", "seq_len=64"]
    assert clock.line("0", job) is None  # no multirun started here
    now = time.time()
    monkeypatch.setattr(sweep_clock.time, "time", lambda: now)
    clock.start(["attention=full,lsh", "seq_len=64", "seed=0,1"])
    monkeypatch.setattr(sweep_clock.time, "time", lambda: now + 90)
    assert clock.line("0", [*job, "seed=0"]) == (
        "job 1 of 4 (attention=full seed=0): 0 done in 1:30"
    )
    for job in ("0", "1"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "result.json").write_text("{}")
        os.utime(tmp_path / job / "result.json", (now + 60, now + 60))
    (tmp_path / "stale").mkdir()  # a record of an earlier multirun does not count
    (tmp_path / "stale" / "result.json").write_text("{}")
    os.utime(tmp_path / "stale" / "result.json", (now - 3600, now - 3600))
    line = clock.line("2", ["attention=lsh", "seq_len=64", "seed=0"])
    assert line == "job 3 of 4 (attention=lsh seed=0): 2 done in 1:30, about 1:30 left"
    assert json.loads(clock.path.read_text())["total"] == 4


@pytest.mark.parametrize("text", ["[]", "{}", '{"started": "soon"}', "nul"])
def test_a_damaged_sweep_clock_gives_no_line_and_no_failure(tmp_path, text):
    clock = sweep_clock.SweepClock(tmp_path)
    clock.path.write_text(text)
    assert clock.line("0", ["seed=0"]) is None
