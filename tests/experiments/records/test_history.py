"""Per-step histories beside the records: written by every trained job whatever the logger,
moved with their record, and what the report's training curves are drawn from."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import figures, load, training_curves
from experiments.app.job import run_job
from experiments.records import history
from tests.experiments.conftest import MEASURE_NOTHING, TINY

QUIET = (*MEASURE_NOTHING, "logger=none", "train.eval_every=1", "train.eval_batches=1")


def test_history_keeps_numeric_metrics_by_full_name_and_replaces_its_file(tmp_path):
    steps = history.History()
    steps.log_step({"loss": 2.0, "train/lr": 1e-3, "eval/loss": math.nan, "phase": "x"}, step=0)
    steps.log_step({"loss": 1.5, "clipped": True}, step=1)
    path = tmp_path / "job" / history.FILE
    steps.write(path)
    written = pd.read_parquet(path)
    assert list(written.itertuples(index=False, name=None)) == [
        (0, "train/loss", 2.0),
        (0, "train/lr", 1e-3),
        (0, "eval/loss", pytest.approx(math.nan, nan_ok=True)),
        (1, "train/loss", 1.5),
    ]
    assert len(history.read(path)) == 3  # readers see finite values only
    assert [p.name for p in path.parent.iterdir()] == [history.FILE]  # no temporary file left
    history.History().write(path)  # no steps: no curve of an older attempt stays behind
    assert not path.exists()


def test_a_job_without_wandb_keeps_its_curve_and_the_report_draws_it(resolved_config, tmp_path):
    config = resolved_config(*TINY, *QUIET, "seq_len=32", "train.steps=3")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "ok" and rec["offline_run_dir"] is None
    steps = history.read(history.beside(tmp_path / "0" / "result.json"))
    assert steps[steps["metric"] == "train/loss"]["step"].tolist() == [0, 1, 2]
    assert steps[steps["metric"] == "train/loss"]["value"].iloc[-1] == pytest.approx(
        rec["train_loss"], rel=0.5
    )
    frame = load.load_results([tmp_path])
    curves = load.load_curves(frame)
    assert set(curves["metric"]) >= {"train/loss", "eval/loss"}
    assert training_curves.why_no_curves(frame) is not None  # 3 random-token steps: not drawn
    # As if it had trained long enough on a quality task: what draws the curve is the history.
    figure = training_curves.training_curves(frame.assign(task="recall", trained_steps=100))
    assert figures.nothing_drawn(figure) is None
    assert any(len(line.get_xdata()) == 3 for line in figure.axes[0].get_lines())


def test_a_displaced_record_and_its_stages_take_their_histories_along(resolved_config, tmp_path):
    sweep_dir, schedule = tmp_path / "sweep", "train.curriculum=[{seq_len:32,steps:1}]"
    first = resolved_config(*TINY, *QUIET, schedule, "train.steps=1", "seed=0")
    rec0 = run_job(first, sweep_dir / "0", job="0", sweep_dir=sweep_dir)
    job0 = sweep_dir / "0"
    before = {name: pd.read_parquet(job0 / name / history.FILE) for name in ("", "stages/32")}
    assert before["stages/32"]["step"].max() < before[""]["step"].max()  # up to its stage
    second = resolved_config(*TINY, *QUIET, schedule, "train.steps=1", "seed=2")
    run_job(second, job0, job="0", sweep_dir=sweep_dir)
    moved = job0 / "displaced" / rec0["config_hash"]
    for name, frame in before.items():
        pd.testing.assert_frame_equal(pd.read_parquet(moved / name / history.FILE), frame)
        assert (job0 / name / history.FILE).is_file()  # the new configuration's own
    curves = load.load_curves(load.load_results([sweep_dir]))
    assert curves.groupby("row")["step"].max().tolist().count(before[""]["step"].max()) == 2
