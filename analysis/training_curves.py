"""The training-curves section of report.md (`SECTION`): training and eval loss per step and
the final losses (`training_curves`) of the runs whose curve says something (`curve_records`:
a task with a quality signal, trained `MIN_CURVE_STEPS` steps or more; `why_no_curves` says why
not), one record per run (`one_record_per_run`)."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from analysis import accuracy, load, series, tuning
from analysis.column_names import (
    EVAL_LOSS,
    JOB,
    SEQ_LEN,
    STATUS,
    TASK,
    TRAIN_LOSS,
    TRAINED_STEPS,
)
from analysis.figures import style
from analysis.section import QUALITY, FigureSpec, Section

# A loss curve of fewer steps shows the noise of its first batches, not learning (the main
# job's timing runs train 3 steps of a random-token LM: every variant within 0.05 nats).
MIN_CURVE_STEPS = 100
# Training loss is drawn as a running mean over this many steps: a mixture's batches differ in
# difficulty (a recall batch is one count at its length: task.train_lengths), so the raw loss
# swings from batch to batch by more than it falls.
SMOOTH_STEPS = 25
TRAIN_STEPS = "train.steps"  # the cap, for records from before trained_steps


def curve_records(frame: pd.DataFrame) -> pd.DataFrame:
    """The records whose loss curve says something: a task with a quality signal (never random
    tokens) trained `MIN_CURVE_STEPS` steps or more (`trained_steps`; `train.steps` for records
    from before it)."""
    if TRAIN_LOSS not in frame or TASK not in frame:
        return frame.iloc[0:0]
    steps = frame[TRAINED_STEPS] if TRAINED_STEPS in frame else pd.Series(float("nan"), frame.index)
    if TRAIN_STEPS in frame:
        steps = steps.fillna(frame[TRAIN_STEPS])
    # The suites' many short jobs (analysis.suites) have tables of their own, not curves.
    quality = ~frame[TASK].isin((*series.NO_QUALITY_TASKS, *series.SUITE_TASKS))
    return frame[quality & (steps >= MIN_CURVE_STEPS)]


def one_record_per_run(frame: pd.DataFrame) -> pd.DataFrame:
    """One record per training run and length: a recall mixture's evaluation points
    (`<job>/n_pairs=P`) are the job's own model, with its history, so each would draw the same
    curve again; the job's own record stands for them. Curriculum stages (another length) stay."""
    if frame.empty or SEQ_LEN not in frame:
        return frame
    run = accuracy.job_key(frame)
    own = ~frame[JOB].map(lambda j: "/" in str(j)) if JOB in frame else True
    ranked = frame.assign(_run=run, _own=own).sort_values("_own", ascending=False, kind="stable")
    kept = ranked.drop_duplicates(["_run", SEQ_LEN]).index
    return frame.loc[frame.index.isin(kept)]


def why_no_curves(frame: pd.DataFrame) -> str | None:
    """Why `training_curves` is not drawn for `frame`, or None when it is."""
    if not curve_records(frame).empty:
        return None
    return (
        f"no run trained {MIN_CURVE_STEPS} steps or more on a task with a quality signal: a "
        "curve of a few random-token steps shows noise, not learning"
    )


def training_curves(
    frame: pd.DataFrame, curves: pd.DataFrame | None = None, seq_len: float | None = None
) -> Figure:
    """Training (solid) and eval (dashed) loss per step, and the final losses per series, of
    the runs whose curve says something (`curve_records`).

    Curves come from the records' histories (`load.load_curves`), at one seq_len (default:
    the most common among records with a training loss, the longest on a tie).
    """
    # Of a learning-rate grid, each series' chosen rate, as the quality table shows.
    frame = curve_records(tuning.choose_learning_rates(frame, series.context_columns(frame)))
    frame = one_record_per_run(frame)
    seq_len = style.pick_length(frame, TRAIN_LOSS) if seq_len is None else seq_len
    at_length = frame[frame[SEQ_LEN] == seq_len] if seq_len is not None else frame
    labelled, _ = series.with_series(at_length, x=SEQ_LEN)
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (curve_ax, final_ax) = style.new_figure(2, f"Training loss{length_note}")
    curves = load.load_curves(labelled) if curves is None else curves
    _draw_curves(curve_ax, labelled, curves)
    _draw_final_losses(final_ax, labelled)
    return style.finish(fig)


def _draw_curves(ax: Axes, labelled: pd.DataFrame, curves: pd.DataFrame) -> None:
    """Per-step losses, mean over seeds with a min..max band: train as a solid line, eval as
    squares (joined by a dashed line when evaluated more than once)."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = style.series_colors(labelled)
    drawn = []
    joined = curves.join(labelled["series"], on="row", how="inner") if len(curves) else None
    for name in order if joined is not None else ():
        for metric, linestyle in (("train/loss", "-"), ("eval/loss", "--")):
            rows = joined[(joined["series"] == name) & (joined["metric"] == metric)]
            if rows.empty:
                continue
            stats = rows.groupby("step")["value"].agg(["mean", "min", "max"])
            if metric == "train/loss":
                stats = stats.rolling(SMOOTH_STEPS, min_periods=1).mean()
            ax.plot(
                stats.index,
                stats["mean"],
                linestyle,
                color=colors[name],
                linewidth=1.2,
                marker="s" if metric == "eval/loss" else None,
                markersize=4,
                label=name if metric == "train/loss" else None,
            )
            ax.fill_between(
                stats.index, stats["min"], stats["max"], color=colors[name], alpha=0.15, linewidth=0
            )
            drawn.append(name)
    if not drawn:
        style.message(
            ax,
            "no per-step history: these records have no W&B run\n"
            "(logger=none, or the runs were not copied with the results)",
        )
    else:
        handles, _ = ax.get_legend_handles_labels()
        handles += [
            Line2D(
                [],
                [],
                color="dimgrey",
                linestyle="-",
                label=f"train loss ({SMOOTH_STEPS}-step mean)",
            ),
            Line2D(
                [], [], color="dimgrey", linestyle="--", marker="s", markersize=4, label="eval loss"
            ),
        ]
        style.legend_below(ax, handles, ncol=1 if len(handles) < 8 else 2)
    style.label_axes(ax, "per step", "step", "loss", log=(False, False))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_final_losses(ax: Axes, labelled: pd.DataFrame) -> None:
    """Final train (o) and eval (s) loss per series, mean with min..max whiskers; failures named."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = style.series_colors(labelled)
    style.label_axes(ax, "final loss (●: train, ■: eval)", "", "loss", log=(False, False))
    ok = labelled[labelled[STATUS] == "ok"] if len(labelled) else labelled
    if ok.empty or ok[[TRAIN_LOSS, EVAL_LOSS]].isna().all().all():
        style.message(ax, "no final losses in these results")
        return
    for i, name in enumerate(order):
        rows = labelled[labelled["series"] == name]
        ok = rows[rows[STATUS] == "ok"]
        for offset, metric, marker in ((-0.12, TRAIN_LOSS, "o"), (0.12, EVAL_LOSS, "s")):
            values = ok[metric].dropna()
            if values.empty:
                continue
            mean = values.mean()
            ax.errorbar(
                i + offset,
                mean,
                yerr=[[mean - values.min()], [values.max() - mean]],
                fmt=marker,
                color=colors[name],
                capsize=3,
                markersize=6,
            )
        if ok[[TRAIN_LOSS, EVAL_LOSS]].isna().all().all():
            ax.plot(i, 0.97, "v", color=colors[name], transform=ax.get_xaxis_transform())
            ax.annotate(  # upright under its marker: neighbouring failures' labels never meet
                style.status_text(rows) or "not trained",
                (i, 0.97),
                fontsize=7,
                xycoords=ax.get_xaxis_transform(),
                xytext=(0, -6),
                textcoords="offset points",
                rotation=90,
                ha="center",
                va="top",
                color=colors[name],
            )
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(order) - 0.4)


SECTION = Section(
    "Training curves",
    figures={
        "training_curves": FigureSpec(
            training_curves,
            "Training and eval loss per step (from the W&B runs; training loss as a 25-step "
            "running mean) and final losses, one per run (a recall mixture's job, not each of "
            "its counts), of the runs that trained 100 steps or more on a task with a quality "
            "signal.",
            when=why_no_curves,
            reads=QUALITY,
        ),
    },
)
