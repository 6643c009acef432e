"""The trade-off figure: quality against speed against memory at one length, after the Long
Range Arena paper's Figure 3."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import accuracy, load, series
from analysis.figures import style
from experiments.record import MIB


def tradeoff_quality(frame: pd.DataFrame) -> tuple[str, str] | None:
    """What the quality axis of the trade-off chart can be: (column, label), or None.

    Trained accuracy where the records have it; else the approximation error on a trained
    model's activations. Never a loss on random tokens, which measures nothing.
    """
    if not series.trained_quality(frame).empty:
        return "eval_accuracy", "trained accuracy (%)"
    if "approx_rel_error" in frame and frame["approx_rel_error"].notna().any():
        return "approx_rel_error", "relative error on trained activations (lower is better)"
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
    quality, ylabel = chosen if chosen else ("eval_accuracy", "quality")
    rows = series.trained_quality(frame) if quality == "eval_accuracy" else frame
    cost = (
        "attn_fwd_bwd_ms"
        if "attn_fwd_bwd_ms" in frame and frame["attn_fwd_bwd_ms"].notna().any()
        else "step_ms"
    )
    if seq_len is None:
        both = rows[rows[cost].notna()] if cost in rows else rows.iloc[0:0]
        seq_len = style.pick_length(both, quality) if len(both) else None
    at_length = frame[frame["seq_len"] == seq_len] if seq_len is not None else frame.iloc[0:0]
    if quality == "eval_accuracy" and len(at_length):
        at_length = at_length[~at_length["task"].isin(series.NO_QUALITY_TASKS)]
        at_length = at_length.assign(eval_accuracy=at_length["eval_accuracy"] * 100)
    # The kernel's own memory where measured: a step's is mostly the rest of the model.
    kernel_memory = (
        "attn_fwd_bwd_peak_bytes" in at_length
        and at_length["attn_fwd_bwd_peak_bytes"].notna().any()
    )
    source = "attn_fwd_bwd_peak_bytes" if kernel_memory else "peak_memory_bytes"
    whose = "the kernel's" if kernel_memory else "a training step's"
    at_length = at_length.assign(peak_memory_mib=at_length[source] / MIB)
    labelled, _ = series.with_series(at_length, x="seq_len")
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (ax,) = style.new_figure(
        1, f"Quality, speed and memory{length_note}\n(marker area ∝ {whose} peak memory)"
    )
    order = series.series_order(labelled) if len(labelled) else []
    colors = style.series_colors(labelled)
    ok = labelled[labelled["status"] == "ok"]
    points = ok.groupby("series")[[cost, quality, "peak_memory_mib"]].mean()
    points = points[points[cost].notna() & points[quality].notna()]
    largest = points["peak_memory_mib"].max()
    handles = []
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
        ax.annotate(
            name, (v[cost], v[quality]), fontsize=7, xytext=(5, 5), textcoords="offset points"
        )
    if points.empty:
        style.message(ax, "no quality with a time at one length in these results")
    elif quality == "eval_accuracy":
        # Accuracy is read against chance and the key-blind floor, and a variant that never
        # learned the task is labelled so (its point is not a cost).
        chance, floor = accuracy.chance_and_floor(labelled)
        for value, linestyle in ((chance, "--"), (floor.mean() if len(floor) else None, "-.")):
            if value is not None:
                ax.axhline(value * 100, color="grey", linestyle=linestyle, linewidth=1)
        marked = accuracy.with_learned(series.trained_quality(frame))
        never = {str(a) for a, jobs in marked.groupby("attention") if not jobs["job_learned"].any()}
        for handle in handles:
            if handle.get_label().split()[0] in never:
                handle.set_label(handle.get_label() + " — not learned")
    if handles:
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12),
            frameon=False,
            markerscale=0.5,
        )
    xlabel = (
        "attention kernel, forward + backward (ms)"
        if cost == "attn_fwd_bwd_ms"
        else ("training step (ms)")
    )
    style.label_axes(ax, "", xlabel, ylabel, log=(not points.empty, False))
    ax.margins(0.15)
    return fig
