"""The training-curves section (analysis.training_curves): which runs have a curve worth
drawing, one record per run, and how the curves and final losses are drawn."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import load, training_curves
from tests.analysis.conftest import synthetic_records


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_curves_of_a_few_random_token_steps_are_not_drawn_and_the_report_says_why(frame):
    """The fixture's jobs train 3 steps of a random-token LM: noise, not learning."""
    assert "no run trained 100 steps or more" in training_curves.why_no_curves(frame)
    assert training_curves.why_no_curves(frame.assign(task="recall", trained_steps=99)) is not None
    learned = frame.assign(task="recall", trained_steps=100)
    assert training_curves.why_no_curves(learned) is None
    long_random = frame.assign(trained_steps=1000)  # random tokens stay noise at any length
    assert training_curves.why_no_curves(long_random) is not None


def test_training_curve_legend_says_how_train_and_eval_are_drawn(frame):
    frame = frame.assign(task="recall", trained_steps=200)  # a run whose curve means something
    at_256 = frame[(frame["seq_len"] == 256) & (frame["seed"] == 0)]
    first = at_256.index[0]
    curves = pd.DataFrame(
        [(first, step, "train/loss", 5.0 - step / 10) for step in range(4)]
        + [(first, 3, "eval/loss", 5.2)],  # evaluated once: one square, no dashes to see
        columns=["row", "step", "metric", "value"],
    )
    figure = training_curves.training_curves(frame, curves=curves, seq_len=256)
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert legend[-2:] == ["train loss (25-step mean)", "eval loss"]
    assert figure.axes[0].get_title() == "per step"


def test_training_curves_draw_each_variants_chosen_rate_of_a_grid_only():
    """The final-loss panel shows the rate chosen on held-out loss, as the quality table does:
    no whisker spanning the grid's rates."""
    rows = [
        {"attention": a, "train.lr": lr, "valid_loss": v, "train_loss": t, "eval_loss": e}
        for a, lr, v, t, e in (
            ("full", 1e-3, 1.9, 2.0, 1.95), ("full", 1e-2, 2.3, 2.4, 2.35),
            ("linear", 1e-3, 2.5, 2.6, 2.55), ("linear", 1e-2, 2.4, 2.5, 2.45),
        )
    ]  # fmt: skip
    base = {"status": "ok", "task": "text", "seq_len": 256, "seed": 0, "trained_steps": 400}
    frame = load.tidy(pd.DataFrame([{**base, **row} for row in rows]))
    figure = training_curves.training_curves(frame, curves=pd.DataFrame(), seq_len=256)
    final_ax = figure.axes[1]
    drawn = sorted(
        round(float(line.get_ydata()[0]), 6)
        for line in final_ax.lines
        if line.get_marker() in ("o", "s") and len(line.get_ydata()) == 1
    )
    assert drawn == [1.95, 2.0, 2.45, 2.5]  # full at 1e-3, linear at 1e-2


def test_a_mixtures_points_draw_one_curve_the_jobs_own_and_stages_stay():
    """A recall mixture's evaluation points (`<job>/n_pairs=P`) share the job's model and
    history: one record per run and length is drawn; a curriculum stage (another length) stays."""
    base = {"status": "ok", "task": "recall", "seed": 0, "trained_steps": 400, "sweep": "s"}
    rows = [
        {"job": "0/n_pairs=8", "task.n_pairs": 8, "seq_len": 256},  # listed before its job
        {"job": "0", "task.n_pairs": 4, "seq_len": 256},
        {"job": "0/n_pairs=16", "task.n_pairs": 16, "seq_len": 256},
        {"job": "1/64", "task.n_pairs": 4, "seq_len": 64},  # a stage: another length
        {"job": "1", "task.n_pairs": 4, "seq_len": 256},
    ]
    frame = pd.DataFrame([{**base, "attention": "full", **row} for row in rows])
    kept = training_curves.one_record_per_run(frame)
    assert sorted(kept["job"]) == ["0", "1", "1/64"]


def test_training_loss_is_drawn_as_a_running_mean():
    """A mixture's per-step loss alternates with the batches' counts; the curve is its
    running mean over `SMOOTH_STEPS` steps (the first points over the steps so far)."""
    base = {"status": "ok", "task": "recall", "seq_len": 256, "seed": 0, "trained_steps": 200}
    frame = load.tidy(pd.DataFrame([{**base, "attention": "full", "train_loss": 1.0}]))
    swings = [(frame.index[0], step, "train/loss", 2.0 if step % 2 else 0.0) for step in range(60)]
    curves = pd.DataFrame(swings, columns=["row", "step", "metric", "value"])
    figure = training_curves.training_curves(frame, curves=curves, seq_len=256)
    (line,) = [ln for ln in figure.axes[0].get_lines() if len(ln.get_xdata()) == 60]
    y = line.get_ydata()
    assert y[0] == 0.0 and y[1] == 1.0  # mean of (0), of (0, 2)
    window = training_curves.SMOOTH_STEPS
    assert all(abs(v - 1.0) <= 1 / window + 1e-9 for v in y[window:])  # the swing averaged out
