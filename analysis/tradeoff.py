"""The trade-off section of report.md (`SECTION`): quality against speed against memory at one
length, after the Long Range Arena paper's Figure 3 (`tradeoff`); drawn when the records hold a
quality to trade (`tradeoff_quality`: trained accuracy, else the error on trained activations)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import accuracy, load, series
from analysis.column_names import (
    APPROX_REL_ERROR,
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    EVAL_ACCURACY,
    PEAK_MEMORY_BYTES,
    SEQ_LEN,
    STATUS,
    STEP_MS,
    TASK,
)
from analysis.figures import style
from analysis.section import QUALITY, FigureSpec, Section
from experiments.records.record import MIB


def tradeoff_quality(frame: pd.DataFrame) -> tuple[str, str] | None:
    """What the quality axis of the trade-off chart can be: (column, label), or None.

    Trained accuracy where the records have it; else the approximation error on a trained
    model's activations. Never a loss on random tokens, which measures nothing.
    """
    if not series.trained_quality(frame).empty:
        return EVAL_ACCURACY, "trained accuracy (%)"
    if APPROX_REL_ERROR in frame and frame[APPROX_REL_ERROR].notna().any():
        return APPROX_REL_ERROR, "relative error on trained activations (lower is better)"
    return None


def tradeoff(frame: pd.DataFrame, seq_len: float | None = None) -> Figure:
    """Quality vs speed vs memory at one seq_len, after the Long Range Arena paper's Figure 3.

    x: the kernel's forward+backward time (else the training step's), y: trained accuracy (else
    the error on trained activations, `tradeoff_quality`), marker area: the kernel's own peak
    memory (forward+backward), else a training step's. Series without a point at that length
    are listed with their status. Default length: the longest at which the most series have
    both quality and time.
    """
    chosen = tradeoff_quality(frame)
    quality, ylabel = chosen if chosen else (EVAL_ACCURACY, "quality")
    rows = series.trained_quality(frame) if quality == EVAL_ACCURACY else frame
    cost = (
        ATTN_FWD_BWD_MS
        if ATTN_FWD_BWD_MS in frame and frame[ATTN_FWD_BWD_MS].notna().any()
        else STEP_MS
    )
    if seq_len is None:
        both = rows[rows[cost].notna()] if cost in rows else rows.iloc[0:0]
        seq_len = style.pick_length(both, quality) if len(both) else None
    at_length = frame[frame[SEQ_LEN] == seq_len] if seq_len is not None else frame.iloc[0:0]
    if quality == EVAL_ACCURACY and len(at_length):
        left_out = (*series.NO_QUALITY_TASKS, *series.SUITE_TASKS)
        at_length = at_length[~at_length[TASK].isin(left_out)]
        at_length = at_length.assign(eval_accuracy=at_length[EVAL_ACCURACY] * 100)
    # The kernel's own memory where measured: a step's is mostly the rest of the model.
    kernel_memory = (
        ATTN_FWD_BWD_PEAK_BYTES in at_length and at_length[ATTN_FWD_BWD_PEAK_BYTES].notna().any()
    )
    source = ATTN_FWD_BWD_PEAK_BYTES if kernel_memory else PEAK_MEMORY_BYTES
    whose = "the kernel's" if kernel_memory else "a training step's"
    at_length = at_length.assign(peak_memory_mib=at_length[source] / MIB)
    labelled, _ = series.with_series(at_length, x=SEQ_LEN)
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (ax,) = style.new_figure(
        1, f"Quality, speed and memory{length_note}\n(marker area ∝ {whose} peak memory)"
    )
    order = series.series_order(labelled) if len(labelled) else []
    colors = style.series_colors(labelled)
    ok = labelled[labelled[STATUS] == "ok"]
    points = ok.groupby("series")[[cost, quality, "peak_memory_mib"]].mean()
    points = points[points[cost].notna() & points[quality].notna()]
    largest = points["peak_memory_mib"].max()
    handles, labels = [], []
    for name in order:
        if name not in points.index:
            statuses = style.status_text(labelled[labelled["series"] == name]) or "not measured"
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colors[name],
                    marker="v",
                    linestyle="none",
                    label=f"{name}: {statuses} (no point)",
                )
            )
            continue
        v = points.loc[name]
        memory = v["peak_memory_mib"]
        measured = np.isfinite(memory) and largest > 0
        handles.append(
            ax.scatter(
                v[cost],
                v[quality],
                s=40 + 760 * memory / largest if measured else 80,
                color=colors[name],
                alpha=0.6,
                edgecolors="black",
                linewidths=0.6,
                label=f"{name} ({memory:.1f} MiB)" if measured else f"{name} (memory not measured)",
            )
        )
        label = ax.annotate(
            name, (v[cost], v[quality]), fontsize=7, xytext=(5, 5), textcoords="offset points"
        )
        labels.append((label, style.AROUND_POINT))
    if points.empty:
        style.message(ax, "no quality with a time at one length in these results")
    elif quality == EVAL_ACCURACY:
        # Accuracy is read against chance and the key-blind floor, and a variant that never
        # learned the task is labelled so (its point is not a cost).
        chance, floor = accuracy.chance_and_floor(labelled)
        for value, linestyle in ((chance, "--"), (floor.mean() if len(floor) else None, "-.")):
            if value is not None:
                ax.axhline(value * 100, color="grey", linestyle=linestyle, linewidth=1)
        marked = accuracy.with_learned(series.trained_quality(frame))
        never = {str(a) for a, jobs in marked.groupby(ATTENTION) if not jobs["job_learned"].any()}
        for handle in handles:
            if handle.get_label().split()[0] in never:
                handle.set_label(handle.get_label() + " — not learned")
    if handles:
        style.legend_below(ax, handles, markerscale=0.5)
    xlabel = (
        "attention kernel, forward + backward (ms)"
        if cost == ATTN_FWD_BWD_MS
        else ("training step (ms)")
    )
    style.label_axes(ax, "", xlabel, ylabel, log=(not points.empty, False))
    ax.margins(0.15)
    style.finish(fig)
    if style.place_labels(ax, labels):  # the legend names every point by its colour
        ax.set_title("(names left out where they would overlap: see the legend)", fontsize=8)
        style.finish(fig)
    return fig


SECTION = Section(
    "Quality, speed and memory",
    figures={
        "tradeoff": FigureSpec(
            tradeoff,
            "Quality against the kernel's forward+backward time at the longest length with "
            "both (trained accuracy, else the error on trained activations; never random-token "
            "loss); marker area is the kernel's own peak memory (forward+backward; a training "
            "step's for records without it).",
            when=lambda frame: (
                None
                if tradeoff_quality(frame) is not None
                else "no trained quality and no error on trained activations: nothing to trade "
                "off (random-token loss is not quality)"
            ),
            reads=QUALITY,
        ),
    },
)
