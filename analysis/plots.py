"""The report's figures: each function takes a results frame (analysis.load) and returns a Figure.

Conventions shared by every figure:
  - one fixed colour per attention variant in every report (`variant_color`: registry order,
    exact attention black), shaded and given its own marker per configuration of that variant;
    one line style per block type (residual solid, reversible dashed, checkpoint dotted);
  - a line is the mean over seeds and repeats, its band the minimum..maximum across them;
  - a configuration that ended oom, timeout, skipped, error or diverged is a downward triangle at
    the top wall of the panel, labelled with its status: failures are data, never dropped;
  - a panel with nothing to draw says why; a figure with nothing drawn in any panel is one that
    `nothing_drawn` names, and the report leaves it out.
Figures are built with `matplotlib.figure.Figure`, not pyplot: no global state and no GUI, so
saving uses Agg (PNG) and the SVG backend whatever the session's backend is; in a notebook a
returned Figure displays inline.
"""

from __future__ import annotations

import textwrap
import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from analysis import accuracy, fit, load, scaling, series
from experiments.records.record import MIB

_WALL_STEP = 0.045  # axes-fraction stagger between failure markers of different series
_LABEL_STEP = 0.05  # axes-fraction stagger between crossover labels
_PASS_TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward"}
_EMPTY = "attnbench-nothing-drawn"  # gid of a panel that only says why it is empty
BLOCK_LINESTYLES = {"residual": "-", "reversible": "--", "checkpoint": ":"}
_OTHER_LINESTYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")
_SHADES = (0.0, 0.38, -0.35, 0.6, -0.55, 0.75)  # + lighter, - darker
# Qualitative colours for the variants after exact attention, in registry order: tab10 without
# its grey (too close to exact attention's black), then tab20's light shades without grey.
_PALETTE = tuple(
    [colormaps["tab10"](i) for i in range(10) if i != 7]
    + [colormaps["tab20"](i) for i in range(1, 20, 2) if i != 15]
)


def time_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Kernel time against seq_len, log-log, forward and forward+backward, and (when the jobs
    measured it) the kernel's speed-up over SDPA against seq_len.

    The legend gives each series' fitted exponent α (all lengths) and its crossover length L*
    against exact attention; a crossover inside the measured range is a star on the curve.
    """
    labelled, keys = series.with_series(frame, x="seq_len")
    speedups = SPEEDUP in labelled and labelled[SPEEDUP].notna().any()
    fig, axes = _figure(3 if speedups else 2, "Attention kernel time vs sequence length")
    for ax, (name, metric) in zip(axes[:2], scaling.TIME_METRICS.items(), strict=True):
        fits = scaling.scaling_fits(labelled, keys, metric)
        notes = {s: _fit_note(f) for s, f in fits.items()}
        xs = _draw(ax, labelled, "seq_len", metric, notes=notes, min_points=2)
        crossed = {
            s: f.crossover.length
            for s, f in fits.items()
            if f.crossover is not None and f.crossover.kind == fit.CROSSED
        }
        if xs:
            _mark_crossovers(ax, labelled, metric, crossed)
        _axes(ax, _PASS_TITLES[name], "seq_len", "time (ms)", log=(True, True), xs=xs)
    if speedups:
        _draw_speedups(axes[2], labelled, scaling.scaling_fits(labelled, keys, "attn_fwd_bwd_ms"))
    return fig


SPEEDUP = "speedup_vs_sdpa"  # the speed-up panel's column; its spread is SPEEDUP + "_iqr"


def _draw_speedups(ax: Axes, labelled: pd.DataFrame, fits: dict[str, scaling.SeriesFit]) -> None:
    """Each series' in-job speed-up over SDPA (forward+backward) against seq_len, log-log: the
    median over rounds (mean over records) with a band of ± half its interquartile range,
    a line at 1 (above: faster than SDPA), and a star at each crossover on it."""
    spread = SPEEDUP + "_iqr"
    with_band = labelled.assign(
        _iqr=labelled[spread] if spread in labelled else 0.0,
    )
    stats = series.mean_spread(with_band, "seq_len", SPEEDUP)
    iqr = series.mean_spread(with_band, "seq_len", "_iqr").set_index(["series", "seq_len"])["mean"]
    styles = series_styles(labelled)
    xs = []
    for name in series.series_order(labelled):
        points = stats[stats["series"] == name]
        if points.empty or name not in fits or fits[name].crossover is None:
            continue  # exact attention (SDPA itself) or a series without speed-ups
        half = np.array([iqr.get((name, x), 0.0) / 2 for x in points["seq_len"]])
        c = fits[name].crossover
        ax.plot(
            points["seq_len"],
            points["mean"],
            **styles[name],
            markersize=4,
            linewidth=1.4,
            label=f"{name}  {_crossover_note(c)}",
        )
        lower = np.maximum(points["mean"] - half, points["mean"] * 0.05)
        ax.fill_between(
            points["seq_len"],
            lower,
            points["mean"] + half,
            color=styles[name]["color"],
            alpha=0.2,
            linewidth=0,
        )
        if c.kind == fit.CROSSED:
            ax.plot(
                c.length,
                1.0,
                "*",
                color=styles[name]["color"],
                markersize=12,
                zorder=5,
                markeredgecolor="black",
            )
        xs += [float(v) for v in points["seq_len"]]
    if not xs:
        _message(ax, f"no {SPEEDUP} in these results")
        _axes(ax, "", "seq_len", "speed-up", log=(False, False))
        return
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.legend(
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        frameon=False,
        ncol=2,
        handlelength=3,
    )
    _axes(
        ax,
        "speed-up over SDPA, forward + backward (in-job rounds; band ± IQR/2)",
        "seq_len",
        "SDPA time / kernel time",
        log=(True, True),
        xs=xs,
    )


# The two memories a reader compares: what the kernel alone holds, and the whole step.
MEMORY_PANELS = (
    ("attn_fwd_bwd_peak_bytes", "Attention kernel alone, forward+backward"),
    ("peak_memory_bytes", "Training step (whole model)"),
)


def memory_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Peak memory (MiB of live tensors) against seq_len, log-log, with fitted exponents: the
    attention kernel's own forward+backward, and a whole training step. A panel whose column
    was not measured (records older than the kernel measure) is left out."""
    panels = [(c, t) for c, t in MEMORY_PANELS if c in frame and frame[c].notna().any()]
    panels = panels or list(MEMORY_PANELS[-1:])  # nothing measured: one empty panel, not drawn
    fig, axes = _figure(len(panels), "Peak memory vs sequence length")
    for ax, (column, title) in zip(axes, panels, strict=True):
        mib = frame.assign(mib=frame[column] / MIB)
        labelled, keys = series.with_series(mib, x="seq_len")
        fits = scaling.scaling_fits(labelled, keys, "mib")
        notes = {s: f"α={f.power_law}" for s, f in fits.items()}
        xs = _draw(ax, labelled, "seq_len", "mib", notes=notes, min_points=2)
        _axes(ax, title, "seq_len", "peak memory (MiB, live tensors)", log=(True, True), xs=xs)
    return fig


def depth(frame: pd.DataFrame) -> Figure:
    """Peak memory and training-step time against depth, one series per block type.

    Only series measured at two depths or more are drawn: the others belong to other sweeps.
    """
    labelled, _ = series.with_series(_with_mib(frame), x="depth")
    depths_per_series = labelled.groupby("series")["depth"].nunique()
    swept = depths_per_series[depths_per_series > 1].index
    labelled = labelled[labelled["series"].isin(swept)]
    title = "Memory and time vs depth"
    left_out = len(depths_per_series) - len(swept)
    if left_out:
        title += f" ({left_out} series measured at one depth only are left out)"
    fig, axes = _figure(2, title)
    for ax, (metric, ylabel) in zip(
        axes,
        (("peak_memory_mib", "peak memory (MiB)"), ("step_ms", "training step (ms)")),
        strict=True,
    ):
        if labelled.empty:
            _message(ax, "depth was not swept in these results: run +experiment=depth")
        xs = _draw(ax, labelled, "depth", metric) if len(labelled) else []
        _axes(ax, "", "depth (layers)", ylabel, log=(False, False), xs=xs)
    return fig


def error_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Relative approximation error ‖out − exact‖/‖exact‖ against seq_len (0 = exact), and
    beside it the kernel swap: the reference's held-out bits/byte change when the kernel
    replaces exact attention in it (0 = no loss), where the records have it."""
    labelled, _ = series.with_series(frame, x="seq_len")
    swap = "swap_delta_bits_per_byte"
    has_swap = swap in labelled and labelled[swap].notna().any()
    fig, axes = _figure(2 if has_swap else 1, "Approximation error vs sequence length")
    xs = _draw(axes[0], labelled, "seq_len", "approx_rel_error", min_points=2)
    _axes(
        axes[0],
        "on the reference's q, k, v",
        "seq_len",
        "relative error (Frobenius)",
        log=(True, False),
        xs=xs,
    )
    if has_swap:
        xs = _draw(axes[1], labelled, "seq_len", swap, min_points=2)
        _axes(
            axes[1],
            "kernel swap into the reference",
            "seq_len",
            "Δ bits/byte (held-out text)",
            log=(True, False),
            xs=xs,
        )
    return fig


def error_vs_knob(frame: pd.DataFrame) -> Figure:
    """Approximation error against each variant's knob (n_hashes, window, n_features, k, ...).

    One panel per approximate variant with an option that takes several values (its first knob
    of `series.KNOBS`, or its first varying option); lines are the other options and the lengths.
    Variants of `series.KNOBS` measured at one knob value only are named under the title.
    """
    swept, fixed = [], []
    approximate = (a for a in dict.fromkeys(frame["attention"].dropna()) if a != series.REFERENCE)
    for attention in approximate:  # exact attention's error is 0 whatever its options
        knobs = _knobs(frame, attention)
        if knobs:
            swept.append((attention, knobs))
        elif attention in series.KNOBS and series.KNOBS[attention][0] in frame:
            rows = frame[frame["attention"] == attention]
            knob = series.KNOBS[attention][0]
            values = rows[knob].dropna().map(load.format_value).unique()
            fixed.append(f"{attention} {knob.split('.', 1)[1]}={','.join(values) or 'none'}")
    cols = min(max(len(swept), 1), 3)
    title = "Approximation error vs each variant's knob"
    if fixed:
        title += "\n" + textwrap.fill(f"(one value only: {'; '.join(fixed)})", 75 * cols)
    fig, axes = _figure(max(len(swept), 1), title, ncols=3)
    if not swept:
        _message(
            axes[0],
            "no variant's option was swept in these results\n"
            "(e.g. +experiment=lsh, +experiment=linformer)",
        )
    for ax, (attention, (knob, *others)) in zip(axes, swept, strict=False):
        rows = frame[(frame["attention"] == attention) & frame[knob].notna()]
        labelled, _ = series.with_series(
            rows.assign(variant=attention), x=knob, context=(*others, *series.context_columns(rows))
        )
        values = sorted(labelled[knob].unique(), key=_knob_sort_key)
        labelled["knob_position"] = labelled[knob].map({v: i for i, v in enumerate(values)})
        _draw(ax, labelled, "knob_position", "approx_rel_error")
        _axes(ax, attention, knob.split(".", 1)[1], "relative error", log=(False, False))
        ax.set_xticks(range(len(values)), [load.format_value(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    return fig


def error_vs_time(frame: pd.DataFrame, seq_len: float | None = None) -> Figure:
    """What accuracy costs: approximation error against the kernel's forward+backward time at
    one seq_len, one point per configuration; a variant's points are joined along its first
    knob (e.g. LSH's n_hashes, one line per bucket_size), each labelled with the knob's value.

    Default length: the one with the most configurations measured, the longest on a tie.
    """
    x, y = "attn_fwd_bwd_ms", "approx_rel_error"
    measured = frame[frame[x].notna() & frame[y].notna()]
    seq_len = _pick_length(measured, x) if seq_len is None else seq_len
    at_length = frame[frame["seq_len"] == seq_len] if seq_len is not None else frame
    labelled, _ = series.with_series(at_length, x="seq_len")
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (ax,) = _figure(1, f"Approximation error vs kernel time{length_note}")
    ok = labelled[(labelled["status"] == "ok") & labelled[x].notna() & labelled[y].notna()]
    if ok.empty:
        _message(ax, "no kernel time with an approximation error in these results")
        _axes(ax, "", "forward+backward kernel time (ms)", "relative error", log=(False, False))
        return fig
    styles = series_styles(labelled)
    handles = []
    for attention in dict.fromkeys(ok["attention"]):
        rows = ok[ok["attention"] == attention]
        knobs = _knobs(rows, attention)
        if not knobs:  # one point per configuration
            for name, point in rows.groupby("series", sort=False)[[x, y]].mean().iterrows():
                style = styles[name]
                (handle,) = ax.plot(
                    point[x], point[y], style["marker"], color=style["color"], label=name
                )
                handles.append(handle)
            continue
        knob = knobs[0]
        others = [*knobs[1:], *series.varying(rows, series.context_columns(rows))]
        keys = [rows[c].map(load.format_value) for c in others]
        lines = rows.groupby(keys, sort=False) if keys else [((), rows)]
        for i, (_, line) in enumerate(lines):
            points = line.groupby(knob)[[x, y]].mean()
            points = points.loc[sorted(points.index, key=_knob_sort_key)]
            color = _shade(variant_color(attention), i)
            text = " ".join(
                [attention]
                + [f"{c.rsplit('.', 1)[-1]}={load.format_value(line[c].iloc[0])}" for c in others]
            )
            (handle,) = ax.plot(
                points[x],
                points[y],
                marker=_MARKERS[i % len(_MARKERS)],
                color=color,
                markersize=5,
                linewidth=1.2,
                label=f"{text} (along {knob.rsplit('.', 1)[-1]})",
            )
            handles.append(handle)
            for value, point in points.iterrows():
                ax.annotate(
                    load.format_value(value),
                    (point[x], point[y]),
                    fontsize=7,
                    color=color,
                    xytext=(4, 3),
                    textcoords="offset points",
                )
    ax.legend(
        handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False
    )
    _axes(ax, "", "forward+backward kernel time (ms)", "relative error", log=(True, False))
    ax.margins(0.12)
    return fig


def training_curves(
    frame: pd.DataFrame, curves: pd.DataFrame | None = None, seq_len: float | None = None
) -> Figure:
    """Training (solid) and eval (dashed) loss per step, and the final losses per series.

    Curves come from the records' histories (`load.load_curves`), at one seq_len (default:
    the most common among records with a training loss, the longest on a tie).
    """
    seq_len = _pick_length(frame, "train_loss") if seq_len is None else seq_len
    at_length = frame[frame["seq_len"] == seq_len] if seq_len is not None else frame
    labelled, _ = series.with_series(at_length, x="seq_len")
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (curve_ax, final_ax) = _figure(2, f"Training loss{length_note}")
    curves = load.load_curves(labelled) if curves is None else curves
    _draw_curves(curve_ax, labelled, curves)
    _draw_final_losses(final_ax, labelled)
    return fig


def accuracy_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Trained accuracy against seq_len per series: mean over seeds with a min..max band.

    Only records of tasks with a quality signal (never random tokens). Dotted: the 90 % that
    exact attention must reach for the setup to measure anything; dashed: chance; dash-dotted:
    the key-blind floor measured on the same batches. A series whose job never reached 90 % is
    labelled "not learned in N steps (control x %)" in the legend (`analysis.accuracy`).
    """
    trained = series.trained_quality(frame).assign(accuracy_pct=lambda f: f["eval_accuracy"] * 100)
    trained = accuracy.with_learned(trained)
    labelled, _ = series.with_series(trained, x="seq_len")
    fig, (ax,) = _figure(1, "Trained accuracy vs sequence length (mean, min–max over seeds)")
    xs = _draw(ax, labelled, "seq_len", "accuracy_pct", notes=_learned_notes(labelled))
    ax.axhline(90, color="grey", linestyle=":", linewidth=1)
    _chance_and_floor(ax, labelled, "seq_len")
    _axes(ax, "", "seq_len", "accuracy (%)", log=(True, False), xs=xs)
    ax.set_ylim(-2, 102)
    return fig


def _learned_notes(labelled: pd.DataFrame) -> dict[str, str]:
    """series -> "(not learned in N steps (control x %))" for series none of whose jobs learned."""
    notes = {}
    for name, rows in labelled.groupby("series"):
        if not rows["job_learned"].any():
            notes[str(name)] = f"({accuracy.not_learned_text(rows)})"
    return notes


def _chance_and_floor(ax: Axes, labelled: pd.DataFrame, x: str) -> None:
    """Chance (dashed) and the measured key-blind floor per `x` (dash-dotted), in percent."""
    chance, floor = accuracy.chance_and_floor(labelled, by=x)
    if chance is not None:
        ax.axhline(chance * 100, color="grey", linestyle="--", linewidth=1)
        ax.annotate("chance", (0.01, chance * 100), xycoords=("axes fraction", "data"), fontsize=7)
    if len(floor):
        ax.plot(floor.index, floor.values * 100, color="grey", linestyle="-.", linewidth=1)
        ax.annotate(
            "key-blind floor",
            (floor.index[-1], floor.values[-1] * 100),
            fontsize=7,
            xytext=(2, 3),
            textcoords="offset points",
        )


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
        seq_len = _pick_length(both, quality) if len(both) else None
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
    fig, (ax,) = _figure(
        1, f"Quality, speed and memory{length_note}\n(marker area ∝ {whose} peak memory)"
    )
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(labelled)
    ok = labelled[labelled["status"] == "ok"]
    points = ok.groupby("series")[[cost, quality, "peak_memory_mib"]].mean()
    points = points[points[cost].notna() & points[quality].notna()]
    largest = points["peak_memory_mib"].max()
    handles = []
    for name in order:
        if name not in points.index:
            statuses = _status_text(labelled[labelled["series"] == name]) or "not measured"
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
        _message(ax, "no quality with a time at one length in these results")
    elif quality == "eval_accuracy":
        # Accuracy is read against chance and the key-blind floor, and a variant that never
        # learned the task is labelled so (its point is not a cost).
        chance, floor = accuracy.chance_and_floor(labelled)
        for value, style in ((chance, "--"), (floor.mean() if len(floor) else None, "-.")):
            if value is not None:
                ax.axhline(value * 100, color="grey", linestyle=style, linewidth=1)
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
    _axes(ax, "", xlabel, ylabel, log=(not points.empty, False))
    ax.margins(0.15)
    return fig


def flops_fraction(frame: pd.DataFrame) -> Figure:
    """Achieved attention GFLOP/s as a fraction of the machine's measured matmul rate."""
    with_fraction = frame.assign(
        fwd_fraction=frame["attn_fwd_gflops_per_s"] / frame["matmul_peak_gflops_per_s"],
        fwd_bwd_fraction=frame["attn_fwd_bwd_gflops_per_s"] / frame["matmul_peak_gflops_per_s"],
    )
    labelled, _ = series.with_series(with_fraction, x="seq_len")
    peak = frame["matmul_peak_gflops_per_s"].median()
    peak_note = f"{peak:.0f} GFLOP/s" if np.isfinite(peak) else "not measured"
    fig, axes = _figure(2, f"Achieved useful FLOP/s ÷ measured matmul rate ({peak_note})")
    for ax, (name, metric) in zip(
        axes, (("fwd", "fwd_fraction"), ("fwd+bwd", "fwd_bwd_fraction")), strict=True
    ):
        xs = _draw(ax, labelled, "seq_len", metric, min_points=2)
        if xs:
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        _axes(
            ax, _PASS_TITLES[name], "seq_len", "fraction of matmul rate", log=(True, False), xs=xs
        )
    return fig


# --- Drawing helpers ------------------------------------------------------------------------


def _draw(
    ax: Axes,
    labelled: pd.DataFrame,
    x: str,
    y: str,
    notes: dict[str, str] | None = None,
    min_points: int = 1,
) -> list[float]:
    """Mean line with min..max band per series, failures at the top wall, a legend below.

    With `min_points` 2 (a curve over seq_len), a panel where no series has two points says
    so instead of drawing lone dots. Returns every x drawn (values and failures), for `_axes`
    to fit the x range to; nothing when the panel is left empty.
    """
    stats = series.mean_spread(labelled, x, y)
    failed = series.failures(labelled, x)
    if stats.empty:  # failures alone make no figure: the report's failures table lists them
        failures_note = "\n(failed ones: see the table 'Not measured')" if len(failed) else ""
        _message(ax, f"no {y} in these results{failures_note}")
        return []
    if stats.groupby("series").size().max() < min_points:
        lengths = ", ".join(load.format_value(v) for v in sorted(stats[x].unique()))
        _message(ax, f"measured at one {x} only ({lengths}): no curve to draw")
        return []
    order = series.series_order(labelled) if len(labelled) else []
    styles = series_styles(labelled)
    handles = []
    _draw_failures(ax, failed, x, {s: st["color"] for s, st in styles.items()}, order)
    for name in order:
        points = stats[stats["series"] == name]
        text = name + (f"  {notes[name]}" if notes and notes.get(name) else "")
        if not points.empty:
            # Exact attention on top: the line every other is read against stays visible.
            exact = name.startswith(series.REFERENCE)
            (line,) = ax.plot(
                points[x],
                points["mean"],
                **styles[name],
                markersize=4,
                linewidth=2.0 if exact else 1.4,
                zorder=3 if exact else 2,
                label=text,
            )
            if (points["n"] > 1).any():
                ax.fill_between(
                    points[x],
                    points["lo"],
                    points["hi"],
                    color=styles[name]["color"],
                    alpha=0.2,
                    linewidth=0,
                )
            handles.append(line)
        rows = failed[failed["series"] == name]
        if points.empty and not rows.empty:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=styles[name]["color"],
                    marker="v",
                    linestyle="none",
                    label=f"{name}: {_status_text(rows)} (no value)",
                )
            )
    if not handles:
        _message(ax, f"no {y} in these results")
        return []
    ax.legend(
        handles=handles,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=1 if len(handles) < 8 else 2,
        frameon=False,
        handlelength=3,
    )
    return [float(v) for v in (*stats[x], *failed[x])]


def _draw_failures(
    ax: Axes, failed: pd.DataFrame, x: str, colors: dict, order: Sequence[str]
) -> None:
    """A downward triangle at the top wall per failed series and x, labelled with its status.

    Series failing at the same x are stacked down from the wall in legend order.
    """
    wall = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for xv, at_x in failed.groupby(x):
        for slot, name in enumerate(s for s in order if (at_x["series"] == s).any()):
            rows = at_x[at_x["series"] == name]
            text = ",".join(
                f"{status}×{n}" if n > 1 else status
                for status, n in zip(rows["status"], rows["n"], strict=True)
            )
            y = 0.97 - slot * _WALL_STEP
            ax.plot(xv, y, "v", color=colors[name], markersize=6, transform=wall, clip_on=False)
            ax.annotate(
                text,
                (xv, y),
                xycoords=wall,
                fontsize=6,
                color=colors[name],
                xytext=(4, -2),
                textcoords="offset points",
            )


def _mark_crossovers(
    ax: Axes, labelled: pd.DataFrame, metric: str, crossed: dict[str, float]
) -> None:
    """A star on each series' curve at its crossover length, and its "L*≈…" label in a row of
    its own near the bottom of the panel (shortest crossover lowest), joined to the star by a
    dotted line: labels of nearby crossovers cannot overlap."""
    styles = series_styles(labelled)
    wall = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for row, (name, length) in enumerate(sorted(crossed.items(), key=lambda item: item[1])):
        points = series.mean_spread(labelled[labelled["series"] == name], "seq_len", metric)
        x, y = np.log(points["seq_len"].astype(float)), np.log(points["mean"].astype(float))
        at = float(np.exp(np.interp(np.log(length), x, y)))
        color = styles[name]["color"]
        ax.plot(length, at, "*", color=color, markersize=14, markeredgecolor="black", zorder=5)
        ax.annotate(
            f"L*≈{length:,.0f}",
            xy=(length, at),
            xytext=(length, 0.04 + row * _LABEL_STEP),
            textcoords=wall,
            fontsize=7,
            color=color,
            ha="center",
            va="center",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": color},
            arrowprops={"arrowstyle": "-", "color": color, "linestyle": ":", "linewidth": 0.8},
        )


def _draw_curves(ax: Axes, labelled: pd.DataFrame, curves: pd.DataFrame) -> None:
    """Per-step losses, mean over seeds with a min..max band: train as a solid line, eval as
    squares (joined by a dashed line when evaluated more than once)."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(labelled)
    drawn = []
    joined = curves.join(labelled["series"], on="row", how="inner") if len(curves) else None
    for name in order if joined is not None else ():
        for metric, style in (("train/loss", "-"), ("eval/loss", "--")):
            rows = joined[(joined["series"] == name) & (joined["metric"] == metric)]
            if rows.empty:
                continue
            stats = rows.groupby("step")["value"].agg(["mean", "min", "max"])
            ax.plot(
                stats.index,
                stats["mean"],
                style,
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
        _message(
            ax,
            "no per-step history: these records have no W&B run\n"
            "(logger=none, or the runs were not copied with the results)",
        )
    else:
        handles, _ = ax.get_legend_handles_labels()
        handles += [
            Line2D([], [], color="dimgrey", linestyle="-", label="train loss (every step)"),
            Line2D(
                [], [], color="dimgrey", linestyle="--", marker="s", markersize=4, label="eval loss"
            ),
        ]
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            frameon=False,
            ncol=1 if len(handles) < 8 else 2,
        )
    _axes(ax, "per step", "step", "loss", log=(False, False))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_final_losses(ax: Axes, labelled: pd.DataFrame) -> None:
    """Final train (o) and eval (s) loss per series, mean with min..max whiskers; failures named."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(labelled)
    _axes(ax, "final loss (●: train, ■: eval)", "", "loss", log=(False, False))
    ok = labelled[labelled["status"] == "ok"] if len(labelled) else labelled
    if ok.empty or ok[["train_loss", "eval_loss"]].isna().all().all():
        _message(ax, "no final losses in these results")
        return
    for i, name in enumerate(order):
        rows = labelled[labelled["series"] == name]
        ok = rows[rows["status"] == "ok"]
        for offset, metric, marker in ((-0.12, "train_loss", "o"), (0.12, "eval_loss", "s")):
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
        if ok[["train_loss", "eval_loss"]].isna().all().all():
            ax.plot(i, 0.97, "v", color=colors[name], transform=ax.get_xaxis_transform())
            ax.annotate(
                _status_text(rows) or "not trained",
                (i, 0.97),
                fontsize=7,
                xycoords=ax.get_xaxis_transform(),
                xytext=(4, -2),
                textcoords="offset points",
                color=colors[name],
            )
    ax.set_xticks(range(len(order)), order, rotation=30, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(order) - 0.4)


# --- Small utilities ------------------------------------------------------------------------


def _figure(panels: int, title: str, ncols: int = 2) -> tuple[Figure, list[Axes]]:
    """A figure of `panels` axes, at most `ncols` per row; unused grid cells are removed."""
    cols = min(panels, ncols)
    rows = -(-panels // cols)
    fig = Figure(figsize=(6.2 * cols, 5.6 * rows), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for extra in axes[panels:]:
        extra.remove()
    fig.suptitle(title, fontsize=11)
    return fig, axes[:panels]


def _axes(
    ax: Axes,
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log: tuple[bool, bool],
    xs: Sequence[float] = (),
) -> None:
    """Scales, labels and grid; with `xs`, an x range holding them all, ticked at each if few.

    A panel without data (only a message) stays linear: a log axis cannot scale nothing.
    """
    if not ax.has_data():
        log = (False, False)
    ax.set_xscale("log" if log[0] else "linear")
    ax.set_yscale("log" if log[1] else "linear")
    for axis, is_log in zip((ax.xaxis, ax.yaxis), log, strict=True):
        if is_log:  # plain numbers: 1, 10, 100 and, between them, 2 and 5 (3 and 4 crowd)
            axis.set_major_formatter(FuncFormatter(_plain_number))
            axis.set_minor_formatter(FuncFormatter(_two_or_five))
    values = sorted({v for v in xs if np.isfinite(v)})
    if values:
        low, high = values[0], values[-1]
        if log[0]:
            ax.set_xlim(low / 1.35, high * 1.35)
        else:
            pad = max((high - low) * 0.06, 0.5)
            ax.set_xlim(low - pad, high + pad)
        if len(values) <= 10:  # label the measured lengths themselves, not powers of ten
            ax.set_xticks(values, [load.format_value(v) for v in values])
            ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _plain_number(value: float, _position=None) -> str:
    return f"{value:g}"


def _two_or_five(value: float, _position=None) -> str:
    """A minor log tick's label if its leading digit is 2 or 5, else none."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** np.floor(np.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


def _message(ax: Axes, text: str) -> None:
    """Say in the panel why it is empty (and mark it so: see `nothing_drawn`)."""
    ax.set_gid(_EMPTY)
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=9,
        color="dimgrey",
        wrap=True,
    )


def nothing_drawn(figure: Figure) -> str | None:
    """Why `figure` shows nothing (the text of its empty panels), or None if it shows data."""
    if not figure.axes or any(ax.get_gid() != _EMPTY for ax in figure.axes):
        return None
    reasons = [t.get_text() for ax in figure.axes for t in ax.texts]
    return "; ".join(dict.fromkeys(" ".join(r.split()) for r in reasons if r))


def variant_color(name: str) -> tuple:
    """The colour of attention variant `name`, the same in every report: black for exact
    attention, then the palette in registry order; a name the registry does not know (records
    of a variant since removed or renamed) takes a colour from a hash of its name."""
    from variants.registry import attention_names

    if name == series.REFERENCE:
        return (0.0, 0.0, 0.0, 1.0)
    known = [n for n in attention_names() if n != series.REFERENCE]
    if name in known and known.index(name) < len(_PALETTE):
        return _PALETTE[known.index(name)]
    return _PALETTE[zlib.crc32(str(name).encode()) % len(_PALETTE)]


def series_styles(labelled: pd.DataFrame) -> dict[str, dict]:
    """Per series of `labelled`: its variant's colour, shaded per configuration of that variant,
    a line style per block type, and a marker per block type when several are drawn (else per
    configuration)."""
    styles: dict[str, dict] = {}
    if labelled.empty or "series" not in labelled:
        return styles
    rows = labelled.drop_duplicates("series")
    blocks = list(dict.fromkeys(rows["block"].dropna())) if "block" in rows else []
    others = [b for b in blocks if b not in BLOCK_LINESTYLES]
    by_block = len(blocks) > 1  # then markers tell blocks apart too, else configurations
    for attention, members in rows.groupby(rows["attention"].map(str), sort=False):
        # A configuration is the series without its block: its blocks share colour and marker.
        configs = members["series"].map(_without_block)
        order = list(dict.fromkeys(configs))
        for (_, row), config in zip(members.iterrows(), configs, strict=True):
            i = order.index(config)
            block = row.get("block")
            linestyle = BLOCK_LINESTYLES.get(
                block, _OTHER_LINESTYLES[others.index(block) % 3] if block in others else "-"
            )
            marker = blocks.index(block) if by_block and block in blocks else i
            styles[row["series"]] = {
                "color": _shade(variant_color(attention), i),
                "marker": _MARKERS[marker % len(_MARKERS)],
                "linestyle": linestyle,
            }
    return styles


def _without_block(label: str) -> str:
    return " ".join(part for part in str(label).split() if not part.startswith("block="))


def _shade(color, i: int) -> tuple:
    """`color` lightened (toward white) or darkened (toward black) for the i-th configuration."""
    rgb = np.array(to_rgb(color))
    amount = _SHADES[i % len(_SHADES)]
    if rgb.max() < 0.15:  # black: only lighter shades are visible
        amount = abs(amount)
    mixed = rgb + (1 - rgb) * amount if amount >= 0 else rgb * (1 + amount)
    return (*np.clip(mixed, 0, 1), 1.0)


def _colors(labelled: pd.DataFrame) -> dict[str, tuple]:
    return {name: style["color"] for name, style in series_styles(labelled).items()}


def _knobs(frame: pd.DataFrame, attention: str) -> list[str]:
    """The options of `attention` that vary in `frame`: its KNOBS first (the first is the one
    drawn along x), then any other, so a new variant's options are found without a list."""
    rows = frame[frame["attention"] == attention]
    options = [c for c in rows.columns if c.startswith("attention.") and c != "attention.name"]
    swept = series.varying(rows, options)
    preferred = [k for k in series.KNOBS.get(attention, ()) if k in swept]
    return preferred + [k for k in swept if k not in preferred]


def _fit_note(f: scaling.SeriesFit) -> str:
    note = f"α={f.power_law}"
    if f.crossover is not None:
        note += f", {_crossover_note(f.crossover)}"
    return note


def _crossover_note(c: fit.Crossover) -> str:
    """ "L*=1,469", "L*≈1,469 (uncertain)", "L*>4,096", "L*≤256"."""
    return f"L*{'=' if c.kind == fit.CROSSED and not c.uncertain else ''}{c}"


def _status_text(rows: pd.DataFrame) -> str:
    statuses = rows.loc[rows["status"] != "ok", "status"]
    return ",".join(dict.fromkeys(statuses))


def _with_mib(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(peak_memory_mib=frame["peak_memory_bytes"] / MIB)


def _pick_length(frame: pd.DataFrame, metric: str) -> float | None:
    """The seq_len with the most status-ok values of `metric` (the longest among ties)."""
    ok = frame[(frame["status"] == "ok") & frame[metric].notna()]
    if ok.empty:
        return None
    counts = ok.groupby("seq_len")["variant"].nunique()
    best = counts[counts == counts.max()].index
    return float(max(best))


def _knob_sort_key(value) -> tuple:
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))
