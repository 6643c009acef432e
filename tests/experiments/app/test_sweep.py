"""How a multirun ends: the table of jobs that did not end ok and the exit code, in-process.

The real multiruns (an invalid option, Ctrl-C) are in test_run.py; here the callback and
`finish` run on records written into a tmp sweep dir.
"""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.app import sweep
from experiments.records import store
from tests.experiments.records.test_store import put, rec


@pytest.fixture(autouse=True)
def _no_multirun_left(monkeypatch):
    monkeypatch.setattr(sweep, "_current", None)


def end_multirun(sweep_dir, records, fail_on=None, *, before=()):
    """A multirun that wrote `records` (and found `before` from an earlier one); its exit code."""
    for job, record in enumerate(before):
        path = put(sweep_dir, f"old{job}", record)
        old = time.time() - 3600
        os.utime(path, (old, old))
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep_dir)}}, "sweep": "s", "fail_on": fail_on}
    )
    callback = sweep.SweepOutcome()
    callback.on_multirun_start(config)
    for job, record in enumerate(records):
        put(sweep_dir, job, {"job": str(job), **record})
    callback.on_multirun_end(config)
    return sweep.finish()


def test_an_error_fails_the_sweep_and_every_job_not_ok_is_listed(tmp_path, capsys):
    code = end_multirun(
        tmp_path,
        [
            rec("a", **{"attention.n_hashes": 0}, status="error"),
            rec("b", **{"attention.n_hashes": 2}),
            rec("c", **{"attention.n_hashes": 4}, status="oom"),
        ],
    )
    out, err = capsys.readouterr()
    assert code == 1 and "error: 1 error in this sweep (fail_on: error)" in err
    header, first, second = out.split("did not end ok:\n", 1)[1].splitlines()[:3]
    assert header.split() == ["job", "status", "attention", "block", "seq_len", "depth"] + [
        "n_hashes",
        "reason",
    ]
    assert first.split()[:2] == ["0", "error"] and first.endswith("error happened")
    assert second.split()[:2] == ["2", "oom"] and second.split()[6] == "4"


def test_oom_and_timeout_are_results_unless_fail_on_says_otherwise(tmp_path, capsys):
    records = [rec("a", status="oom"), rec("b", status="timeout"), rec("c")]
    assert end_multirun(tmp_path / "1", records) == 0
    assert "no job ended error: exit code 0" in capsys.readouterr().out
    assert end_multirun(tmp_path / "2", records, fail_on=["error", "oom"]) == 1
    assert "1 oom" in capsys.readouterr().err


def test_only_this_multiruns_jobs_count(tmp_path, capsys):
    # An error recorded by an earlier multirun of another configuration does not fail this one.
    assert end_multirun(tmp_path, [rec("b")], before=[rec("a", status="error")]) == 0
    assert capsys.readouterr().out == ""


def test_an_unknown_fail_on_status_stops_the_multirun_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        end_multirun(tmp_path, [], fail_on=["crash"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: config: option 'fail_on' must list statuses among oom, timeout, skipped, error, "
        "diverged; got 'crash'"
    )


def test_a_sweep_whose_results_could_not_be_gathered_fails_with_one_line(
    tmp_path, capsys, monkeypatch
):
    """Issue 26: with the sweep's lock file a symlink (or the disk full), the end of the multirun
    wrote no results.csv, Hydra printed a two-line warning and the sweep exited 0."""
    monkeypatch.setattr(store, "_failed_gathers", {})
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / store.LOCK).symlink_to(elsewhere)
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep_dir)}}, "sweep": "s", "fail_on": None}
    )

    def end() -> int:
        callbacks = (sweep.SweepOutcome(), store.GatherResults())
        callbacks[0].on_multirun_start(config)
        put(sweep_dir, 0, {"job": "0", **rec("a")})
        for callback in callbacks:  # the order Hydra ends a multirun in
            callback.on_multirun_end(config=config)
        return sweep.finish()

    assert end() == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {sweep_dir / 'results.csv'} not gathered")
    assert str(sweep_dir / store.LOCK) in err[0] and "python -m experiments.records.store" in err[0]
    assert elsewhere.read_text() == "keep me" and not (sweep_dir / "results.csv").exists()
    (sweep_dir / store.LOCK).unlink()  # the next multirun gathers, and passes
    assert end() == 0 and len(pd.read_csv(sweep_dir / "results.csv")) == 1
