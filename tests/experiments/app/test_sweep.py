"""How a multirun ends: the one end-of-sweep step, in-process.

The real multiruns (an invalid option, Ctrl-C) are in test_run.py; here the callback and its
step run on records written into a tmp sweep dir.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.app import sweep
from experiments.records import store
from tests.experiments.records.test_store import put, rec


@pytest.fixture(autouse=True)
def _sigint_restored():
    """A multirun started in a test makes Ctrl-C raise `sweep.Interrupted`; put it back."""
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)


def multirun_config(sweep_dir, fail_on=None, *, report=False):
    return OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(sweep_dir)}},
            "sweep": "s",
            "fail_on": fail_on,
            "report": report,
            "logger": {"name": "none"},
        }
    )


def end_multirun(sweep_dir, records, fail_on=None, *, before=()):
    """A multirun that wrote `records` (and found `before` from an earlier one); its exit code."""
    for job, record in enumerate(before):
        path = put(sweep_dir, f"old{job}", record)
        old = time.time() - 3600
        os.utime(path, (old, old))
    callback = sweep.SweepEnd()
    callback.on_multirun_start(multirun_config(sweep_dir, fail_on))
    for job, record in enumerate(records):
        put(sweep_dir, job, {"job": str(job), **record})
    return callback.multirun.end()


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
    assert "did not end ok" not in capsys.readouterr().out


def test_an_unknown_fail_on_status_stops_the_multirun_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        end_multirun(tmp_path, [], fail_on=["crash"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: config: option 'fail_on' must list statuses among oom, timeout, skipped, error, "
        "diverged; got 'crash'"
    )


def test_a_sweep_whose_results_could_not_be_gathered_fails_with_one_line(tmp_path, capsys):
    """With the sweep's lock file a symlink (or the disk full), the end of the multirun once
    wrote no results.csv, Hydra printed a two-line warning and the sweep exited 0."""
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / store.LOCK).symlink_to(elsewhere)

    def end() -> int:
        return end_multirun(sweep_dir, [rec("a")])

    assert end() == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {sweep_dir / 'results.csv'} not gathered")
    assert str(sweep_dir / store.LOCK) in err[0] and "python -m experiments.records.store" in err[0]
    assert elsewhere.read_text() == "keep me" and not (sweep_dir / "results.csv").exists()
    (sweep_dir / store.LOCK).unlink()  # the next multirun gathers, and passes
    assert end() == 0 and len(pd.read_csv(sweep_dir / "results.csv")) == 1


def test_the_step_runs_in_order_gather_report_outcome(tmp_path, capsys):
    drawn = []

    def update(sweep_dir, logger_cfg, summarize):
        drawn.append((sweep_dir, logger_cfg))
        print("REPORT")

    callback = sweep.SweepEnd(report_step=update)
    callback.on_multirun_start(multirun_config(tmp_path, report=True))
    put(tmp_path, 0, {"job": "0", **rec("a", status="error")})
    assert callback.multirun.end() == 1
    out = capsys.readouterr().out
    assert drawn == [(tmp_path, {"name": "none"})]
    gathered, reported, listed = (out.index(s) for s in ("1 configurations", "REPORT", "did not"))
    assert gathered < reported < listed


def test_report_false_draws_no_report(tmp_path):
    callback = sweep.SweepEnd(report_step=lambda *a, **k: pytest.fail("report drawn"))
    callback.on_multirun_start(multirun_config(tmp_path, report=False))
    put(tmp_path, 0, {"job": "0", **rec("a")})
    assert callback.multirun.end() == 0


def test_the_report_step_is_analysis_named_in_the_config_not_imported():
    """experiments imports nothing of analysis (a floor above); conf/config.yaml names the report
    step the end-of-sweep callback is built with (tests/experiments/test_packages.py: no import)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from analysis import sweep_report
    from experiments.app import resolvers

    resolvers.register()
    GlobalHydra.instance().clear()
    conf = Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        config = compose(config_name="config", return_hydra_config=True)
    GlobalHydra.instance().clear()
    callback = instantiate(config.hydra.callbacks.sweep_end)
    assert isinstance(callback, sweep.SweepEnd)
    assert callback.report_step is sweep_report.update


def test_without_a_report_step_no_report_is_drawn(tmp_path):
    callback = sweep.SweepEnd()
    callback.on_multirun_start(multirun_config(tmp_path, report=True))
    put(tmp_path, 0, {"job": "0", **rec("a")})
    assert callback.multirun.end() == 0
    assert (tmp_path / "results.csv").is_file() and not (tmp_path / "report").exists()


def test_the_exit_code_ends_the_process_at_the_multiruns_end(tmp_path):
    config = multirun_config(tmp_path)
    callback = sweep.SweepEnd()
    callback.on_multirun_start(config)
    put(tmp_path, 0, {"job": "0", **rec("a")})
    callback.on_multirun_end(config=config)  # 0: the app returns normally
    callback.on_multirun_start(config)
    put(tmp_path, 1, {"job": "1", **rec("b", status="error")})
    with pytest.raises(SystemExit) as ended:
        callback.on_multirun_end(config=config)
    assert ended.value.code == 1


def test_ctrl_c_carries_the_multirun_whose_end_gathers_and_says_how_to_continue(tmp_path, capsys):
    callback = sweep.SweepEnd()
    callback.on_multirun_start(multirun_config(tmp_path))
    put(tmp_path, 0, {"job": "0", **rec("a")})
    with pytest.raises(sweep.Interrupted) as stop:
        signal.raise_signal(signal.SIGINT)
    assert stop.value.multirun is callback.multirun
    assert stop.value.multirun.end(interrupted=True) == sweep.INTERRUPTED
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a 2nd one stops
    assert len(pd.read_csv(tmp_path / "results.csv")) == 1
    err = capsys.readouterr().err
    assert "interrupted: gathering" in err and "re-run the same command" in err


def test_the_callback_goes_to_each_jobs_process_without_the_multirun(tmp_path):
    callback = sweep.SweepEnd(report_step=lambda *a: None)  # a lambda: no pickling it
    callback.on_multirun_start(multirun_config(tmp_path))
    shipped = pickle.loads(pickle.dumps(callback))  # as launchers ship it
    assert shipped.multirun is None and shipped.report_step is None


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "a/../../x", ".."])
def test_a_sweep_name_that_leaves_multirun_is_refused_in_one_line(tmp_path, capsys, name):
    """A sweep name is a folder under multirun/: `sweep=../../x` once wrote outside it."""
    config = multirun_config(tmp_path / "multirun" / name)
    config.sweep = name
    for start in (sweep.SweepEnd().on_multirun_start, sweep.SweepEnd().on_run_start):
        with pytest.raises(SystemExit) as stop:
            start(config)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: config: option 'sweep'")
        assert repr(name) in err
    assert not (tmp_path / "multirun").exists()


def test_a_nested_sweep_name_is_accepted():
    assert store.check_relative_name("sweep", "paper/scaling") == "paper/scaling"


def test_a_record_of_the_wrong_type_is_named_and_the_rest_reported(tmp_path, capsys):
    """A record with a numeric timestamp made the end say "gather failed / report failed: '<'
    not supported" without naming the file, and exit 1."""
    bad = rec("b", status="oom", timestamp=1733000000, job="1")
    code = end_multirun(tmp_path, [rec("a"), bad, rec("c", status="timeout")])
    out, err = capsys.readouterr()
    assert code == 0 and "failed" not in err
    assert f"unreadable record {tmp_path / '1' / 'result.json'}: " in err
    assert "2 configurations" in out and "1 job(s) of this multirun did not end ok" in out
