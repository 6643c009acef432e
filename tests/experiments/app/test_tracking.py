"""W&B tracking against real offline W&B: what a job logs is what W&B's own reader reads back
(tests/wandb_runs.py)."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import pathlib
import socket
import time

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.app import tracking
from experiments.records import record
from experiments.records import record as rec_module
from tests import wandb_runs
from tests.conftest import WANDB_LOGGER

RUN_CONFIG = {
    "attention": {"name": "lsh", "bucket_size": 32, "n_hashes": 2, "seed": None},
    "seq_len": 256,
    "batch_size": 2,
    "tags": ["a", "b"],
}
RECORD = {
    "sweep": "s1",
    "job": "0",
    "status": "ok",
    "error": None,
    "attention": "lsh",
    "attention.bucket_size": 32,
    "seq_len": 256,
    "causal": True,
    "attn_fwd_ms": 1.25,
    "step_ms": 7.5,
    "peak_memory_bytes": 123456789,
    "approx_rel_error": float("nan"),
    "eval_loss": 2.0,
    "timestamp": "2026-01-01T00:00:00",
}


@pytest.fixture(autouse=True)
def _isolated_wandb(wandb_home):
    """Every test here talks to a real offline W&B, isolated by tests/conftest.py."""


def start(out_dir, logger_cfg=WANDB_LOGGER, name="job-0", tags=("lsh", "seq_len=256"), **run_id):
    return tracking.start_tracker(
        logger_cfg,
        run_config=RUN_CONFIG,
        group="s1",
        job_type="bench",
        tags=list(tags),
        name=name,
        out_dir=out_dir,
        **run_id,
    )


def expected_summary(record):
    """The record but its configuration (that is the run's config, never copied into the
    summary). W&B keeps no None; it writes NaN as null, which reads back as absent too."""
    config = {
        *rec_module.config_keys(record),
        *rec_module.ALIASES.values(),
        *rec_module.RESOLVED.values(),
    }
    return {
        k: v
        for k, v in record.items()
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and k not in config
    }


def test_offline_run_reads_back_as_logged(tmp_path):
    tracker = start(tmp_path)
    for step in range(5):
        tracker.log_step({"loss": 1.0 / (step + 1), "eval/loss": 2.0}, step=step)
    tracker.finish(RECORD, exit_code=0)

    assert tracker.run_dir.parent == tmp_path / "wandb"
    assert tracker.run_dir.name.startswith("offline-run-")
    assert wandb_runs.find(tmp_path) == [tracker.run_dir]
    run = wandb_runs.read(tracker.run_dir)
    assert run["config"] == RUN_CONFIG
    summary = expected_summary(RECORD)
    assert {k: run["summary"].get(k) for k in summary} == summary
    assert "error" not in run["summary"] and "approx_rel_error" not in run["summary"]
    # One name per metric: the config stays in the config, a curve's last point is the
    # record's column (eval_loss), not also `eval/loss`.
    assert not {"attention", "attention.bucket_size", "causal"} & set(run["summary"])
    assert run["summary"]["eval_loss"] == 2.0 and "eval/loss" not in run["summary"]
    steps = [row for row in run["history"] if "step" in row]
    assert [row["step"] for row in steps] == [0, 1, 2, 3, 4]
    assert [row["train/loss"] for row in steps] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert all(row["eval/loss"] == 2.0 for row in steps)
    # One more row puts the per-job costs on the seq_len axis (NaN error left out).
    assert run["history"][-1] == {
        "seq_len": 256,
        "attn_fwd_ms": 1.25,
        "step_ms": 7.5,
        "peak_memory_bytes": 123456789,
    }
    assert (run["group"], run["job_type"], run["name"]) == ("s1", "bench", "job-0")
    assert run["tags"] == ["lsh", "seq_len=256"]
    assert (run["project"], run["exit_code"]) == ("attnbench", 0)


def test_two_jobs_in_one_process_get_separate_runs(tmp_path):
    hydra_cfg = OmegaConf.create(WANDB_LOGGER)  # as the runner passes it
    first = start(tmp_path / "job0", hydra_cfg, name="job-0")
    first.log_step({"loss": 1.0}, step=0)
    first.finish({**RECORD, "job": "0"}, exit_code=0)
    second = start(tmp_path / "job1", hydra_cfg, name="job-1")
    second.finish({**RECORD, "job": "1", "status": "error", "error": "boom"}, exit_code=1)

    assert first.run_dir != second.run_dir
    assert wandb_runs.find(tmp_path) == [first.run_dir, second.run_dir]
    one, two = (wandb_runs.read(t.run_dir) for t in (first, second))
    assert (one["name"], one["summary"]["job"], one["exit_code"]) == ("job-0", "0", 0)
    assert (two["name"], two["summary"]["job"], two["exit_code"]) == ("job-1", "1", 1)
    assert two["summary"]["error"] == "boom"
    assert not [row for row in two["history"] if "step" in row]
    assert one["run_id"] != two["run_id"]


def test_a_remeasured_configuration_replaces_its_run_and_an_interrupted_one_leaves_none(
    tmp_path,
):
    sweep = tmp_path / "sweep"
    run_id = tracking.run_id("s1 (scaling)/x", "0123456789ab", sweep)
    token = (sweep / ".sweep_id").read_text().strip()
    assert run_id == f"s1-scaling-x-{token}-0123456789ab"  # the characters W&B allows
    first = start(sweep / "0", run_id=run_id, replace_in=sweep)
    first.finish({**RECORD, "status": "oom"}, exit_code=1)
    # Re-measured in another job dir (a value inserted before it): the old run goes.
    second = start(sweep / "1", run_id=run_id, replace_in=sweep)
    second.finish(RECORD, exit_code=0)
    assert wandb_runs.find(sweep) == [second.run_dir]
    run = wandb_runs.read(second.run_dir)
    assert (run["run_id"], run["summary"]["status"], run["exit_code"]) == (run_id, "ok", 0)

    other = start(
        sweep / "2", run_id=tracking.run_id("s1", "ffffffffffff", sweep), replace_in=sweep
    )
    other.log_step({"loss": 1.0}, step=0)
    other.discard()  # Ctrl-C: the job leaves no record, so no run
    assert wandb_runs.find(sweep) == [second.run_dir] and other.run_dir is None


def test_one_summary_run_per_sweep_however_often_it_ends(tmp_path):
    for _ in range(2):
        run_dir = tracking.log_sweep_summary(
            WANDB_LOGGER, records=pd.DataFrame([RECORD]), figures={}, group="s1", out_dir=tmp_path
        )
    assert wandb_runs.find(tmp_path) == [run_dir]
    token = tracking.sweep_id(tmp_path)
    assert wandb_runs.read(run_dir)["run_id"] == f"s1-{token}-summary"


def test_two_sweep_dirs_of_one_name_sharing_a_logger_dir_keep_each_others_runs(tmp_path):
    """The second sweep (default name, same `logger.dir`) used to delete
    the first's offline run of the same configuration, leaving its record pointing at nothing."""
    shared = {**WANDB_LOGGER, "dir": str(tmp_path / "wandb")}
    first_dir, second_dir = tmp_path / "a" / "default", tmp_path / "b" / "default"
    runs = []
    for sweep_dir in (first_dir, second_dir):
        tracker = start(
            sweep_dir / "0",
            shared,
            run_id=tracking.run_id("default", "0123456789ab", sweep_dir),
            replace_in=sweep_dir,
        )
        tracker.finish(RECORD, exit_code=0)
        runs.append(tracker.run_dir)
    assert all(run.is_dir() for run in runs)
    assert sorted(wandb_runs.find(tmp_path / "wandb")) == sorted(runs)
    # Re-running the first sweep dir still replaces its own run, and only that one.
    again = start(
        first_dir / "0",
        shared,
        run_id=tracking.run_id("default", "0123456789ab", first_dir),
        replace_in=first_dir,
    )
    again.finish(RECORD, exit_code=0)
    # Counted, not named: a re-run within the same second gets the same folder name as the run
    # it replaces, so "runs[0] is gone" cannot be asked of the path.
    left = sorted(wandb_runs.find(tmp_path / "wandb"))
    assert left == sorted([runs[1], again.run_dir]) and runs[1] != again.run_dir


def test_a_sweep_dir_has_one_identity_whoever_asks_first(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: tracking.sweep_id(tmp_path / "sweep"), range(16)))
    assert len(tokens) == 1 and tracking.sweep_id(tmp_path / "sweep") in tokens
    assert [p.name for p in (tmp_path / "sweep").iterdir()] == [".sweep_id"]  # no temp files
    assert tracking.sweep_id(tmp_path / "other") not in tokens
    (tmp_path / "sweep" / ".sweep_id").write_text("[]")  # damaged: a new identity, said
    assert tracking.sweep_id(tmp_path / "sweep") not in tokens | {"[]"}


def test_no_wandb_service_outlives_a_finished_run(tmp_path):
    psutil = pytest.importorskip("psutil")

    def services():
        return [p for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]

    tracker = start(tmp_path)
    assert services()  # W&B's service runs while the job does
    tracker.finish(RECORD, exit_code=0)
    assert not services()


def test_logger_none_and_disabled_are_no_ops(tmp_path, monkeypatch):
    trackers = [
        start(tmp_path, {"name": "none"}),
        start(tmp_path, {**WANDB_LOGGER, "mode": "disabled"}),
    ]
    monkeypatch.setenv("WANDB_MODE", "disabled")
    trackers.append(start(tmp_path, WANDB_LOGGER))
    for tracker in trackers:
        assert type(tracker) is tracking.Tracker and tracker.run_dir is None
        tracker.log_step({"loss": 1.0}, step=0)
        tracker.finish(RECORD, exit_code=0)
    assert not (tmp_path / "wandb").exists()
    assert (
        tracking.log_sweep_summary(
            {"name": "none"},
            records=pd.DataFrame([RECORD]),
            figures={},
            group="s1",
            out_dir=tmp_path,
        )
        is None
    )


def test_wandb_mode_environment_variable_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = start(
        tmp_path, {**WANDB_LOGGER, "mode": "online"}
    )  # online would fail: no server here
    tracker.finish(RECORD, exit_code=0)
    assert tracker.run_dir.name.startswith("offline-run-")
    monkeypatch.setenv("WANDB_MODE", "ofline")
    with pytest.raises(ValueError, match="WANDB_MODE='ofline' must be one of"):
        start(tmp_path, WANDB_LOGGER)


def test_scaling_metrics_are_numeric_record_columns_and_default_to_the_schemas(tmp_path):
    with pytest.raises(ValueError, match="'scaling_metrics' lists 'attn_fwd_sec'"):
        start(tmp_path, {**WANDB_LOGGER, "scaling_metrics": ["attn_fwd_ms", "attn_fwd_sec"]})
    with pytest.raises(ValueError, match="'scaling_metrics' lists 'timing_warning'"):
        start(
            tmp_path, {**WANDB_LOGGER, "scaling_metrics": ["timing_warning"]}
        )  # text, not a number
    default = {k: v for k, v in WANDB_LOGGER.items() if k != "scaling_metrics"}
    tracker = start(tmp_path, default)
    assert tracker._scaling_metrics == record.SCALING_METRICS
    tracker.finish(RECORD, exit_code=0)


def test_the_logger_config_is_checked_against_its_schema(resolved_config):
    logger = resolved_config()["logger"]
    assert logger["scaling_metrics"] == list(record.SCALING_METRICS)  # the schema's default
    with pytest.raises(Exception, match="init_timeout"):
        resolved_config("logger.init_timeout=soon")


def test_failed_start_warns_once_and_returns_no_op(tmp_path, monkeypatch, caplog):
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    online = {**WANDB_LOGGER, "mode": "online", "init_timeout": 3}
    begin = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="experiments.app.tracking"):
        trackers = [start(tmp_path / f"job{i}", online, name=f"job-{i}") for i in range(3)]
    assert time.perf_counter() - begin < 30  # one timed-out attempt, then W&B stays off
    for tracker in trackers:
        assert type(tracker) is tracking.Tracker and tracker.run_dir is None
        tracker.finish(RECORD, exit_code=0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "W&B is off" in warnings[0].getMessage()


def test_sweep_summary_logs_table_and_figures(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(2, 2))
    axes.plot([128, 256], [1.0, 4.0])
    png = tmp_path / "scaling.png"
    figure.savefig(png)
    plt.close(figure)
    records = pd.DataFrame(
        [
            RECORD,
            {
                **RECORD,
                "job": "1",
                "seq_len": 512,
                "status": "oom",
                "error": "out of memory",
                "attn_fwd_ms": None,
                "attention.bucket_size": "auto",
            },
        ]
    )

    results = tmp_path / "results.parquet"
    records.astype(str).to_parquet(results)
    run_dir = tracking.log_sweep_summary(
        WANDB_LOGGER,
        records=records,
        figures={"scaling": png},
        group="s1",
        out_dir=tmp_path / "summary",
        results=results,
    )
    run = wandb_runs.read(run_dir)
    assert (run["job_type"], run["group"], run["exit_code"]) == ("sweep-summary", "s1", 0)
    token = tracking.sweep_id(tmp_path / "summary")
    assert f"s1-{token}-results" in run["artifacts"]  # the sweep's results.parquet
    summary = run["summary"]  # W&B's reader names a nested key by its path, with dots
    types = (summary["records._type"], summary["figures/scaling._type"])
    assert types == ("table-file", "image-file")
    table = json.loads((run_dir / "files" / summary["records.path"]).read_text())
    assert table["columns"] == list(records.columns)
    assert [row[table["columns"].index("status")] for row in table["data"]] == ["ok", "oom"]
    assert (run_dir / "files" / summary["figures/scaling.path"]).is_file()


def test_a_symlinked_sweep_id_is_not_followed_nor_quoted(tmp_path, caplog):
    """A symlinked `.sweep_id` was followed and 20 characters of its target echoed in the
    warning: a sweep dir must not leak another file."""
    secret = tmp_path / "secret"
    secret.write_text("hunter2-do-not-print-me\n")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / tracking.SWEEP_ID_FILE).symlink_to(secret)
    with caplog.at_level(logging.WARNING):
        token = tracking.sweep_id(sweep_dir)
    assert "hunter2" not in caplog.text and "is a symlink, not followed" in caplog.text
    path = sweep_dir / tracking.SWEEP_ID_FILE
    assert not path.is_symlink() and path.read_text().strip() == token
    assert secret.read_text() == "hunter2-do-not-print-me\n"
    assert tracking.sweep_id(sweep_dir) == token


def test_a_sweep_id_that_cannot_be_written_names_it_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """ENOSPC writing `.sweep_id` named no file and left its temp file."""

    def full(self, *args, **kwargs):
        with open(self, "w"):  # created, then no space for its data
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(OSError, match=r"No space left on device: '.*/\.sweep_id'"):
        tracking.sweep_id(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_runs_are_named_by_what_ran_and_grouped_by_their_sweep_dir(tmp_path):
    """`linear-L256-residual-<hash>`, not the job's number; without `sweep=` the group is the
    sweep dir's name, not `default` for every sweep."""
    rec = {"attention": "linear", "seq_len": 256, "block": "residual", "layers": "linear"}
    assert tracking.run_name(rec, "421e3a0b9c1d") == "linear-L256-residual-421e3a"
    hybrid = rec | {"layers": "3×deltanet+full"}
    assert (
        tracking.run_name(hybrid, "421e3a0b9c1d") == "linear-L256-residual-3×deltanet+full-421e3a"
    )
    assert tracking.group_of("default", tmp_path / "mine") == "mine"
    assert tracking.group_of("scaling", tmp_path / "mine") == "scaling"
    assert tracking.group_of("default", None) == "default"


def test_an_interrupted_run_that_w_and_b_cannot_close_is_given_up_not_waited_for(
    tmp_path, monkeypatch, caplog
):
    import threading

    import wandb

    stuck = threading.Event()  # W&B 0.31's teardown, stuck after a Ctrl-C mid-call
    tracker = start(tmp_path)
    tracker.log_step({"loss": 1.0}, step=0)
    monkeypatch.setattr(wandb, "teardown", lambda *a, **k: stuck.wait())
    monkeypatch.setattr(tracking, "CLOSE_AFTER_INTERRUPT_S", 0.2)
    run_dir = tracker.run_dir
    discarding = threading.Thread(target=tracker.discard)
    discarding.start()
    discarding.join(10)  # a discard that waited for W&B would still be running
    returned = not discarding.is_alive()
    stuck.set()
    assert returned
    assert not run_dir.exists() and tracker.run_dir is None
    assert "did not close within 0.2 s of the interrupt" in caplog.text
