"""The report's figures: each function takes a results frame (analysis.load) and returns a Figure.

Conventions shared by every figure:
  - one colour per series (`analysis.series`), exact attention first and in black;
  - a line is the mean over seeds and repeats, its band the minimum..maximum across them;
  - a configuration that ended oom, timeout, skipped, error or diverged is a downward triangle at
    the top wall of the panel, labelled with its status: failures are data, never dropped;
  - a panel with nothing to draw says why, so every figure always exists.
Figures are built with `matplotlib.figure.Figure`, not pyplot: no global state and no GUI, so
saving uses Agg (PNG) and the SVG backend whatever the session's backend is; in a notebook a
returned Figure displays inline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter, MaxNLocator, NullFormatter

from analysis import fit, load, scaling, series

MIB = 2**20
KNOBS = {  # each approximate variant's knobs: error is drawn against the first
    "lsh": ("attention.n_hashes", "attention.bucket_size"),
    "routing": ("attention.window", "attention.n_clusters"),
    "performer": ("attention.n_features",),
    "linformer": ("attention.k",),
    "blockwise": ("attention.block_size",),
    "compressed": ("attention.factor",),
    "strided": ("attention.stride",),
}
_WALL_STEP = 0.045  # axes-fraction stagger between failure markers of different series
_PASS_TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward"}


def time_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Kernel time against seq_len, log-log, forward and forward+backward.

    The legend gives each series' fitted exponent α (all lengths) and its crossover length L*
    against exact attention; a crossover inside the measured range is a star on the curve.
    """
    labelled, keys = series.with_series(frame, x="seq_len")
    fig, axes = _figure(2, "Attention kernel time vs sequence length")
    for ax, (name, metric) in zip(axes, scaling.TIME_METRICS.items(), strict=True):
        fits = scaling.scaling_fits(labelled, keys, metric)
        notes = {s: _fit_note(f) for s, f in fits.items()}
        xs = _draw(ax, labelled, "seq_len", metric, notes=notes)
        for s, f in fits.items():
            if f.crossover is not None and f.crossover.kind == fit.CROSSED:
                _mark_crossover(ax, labelled, s, metric, f.crossover.length)
        _axes(ax, _PASS_TITLES[name], "seq_len", "time (ms)", log=(True, True), xs=xs)
    return fig


def memory_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Peak memory of one training step against seq_len, log-log, with fitted exponents."""
    labelled, keys = series.with_series(_with_mib(frame), x="seq_len")
    fits = scaling.scaling_fits(labelled, keys, "peak_memory_mib")
    fig, (ax,) = _figure(1, "Peak memory of a training step vs sequence length")
    notes = {s: f"α={f.power_law}" for s, f in fits.items()}
    xs = _draw(ax, labelled, "seq_len", "peak_memory_mib", notes=notes)
    _axes(ax, "", "seq_len", "peak memory (MiB, live tensors)", log=(True, True), xs=xs)
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
    """Relative approximation error ‖out − exact‖/‖exact‖ against seq_len (0 = exact)."""
    labelled, _ = series.with_series(frame, x="seq_len")
    fig, (ax,) = _figure(1, "Approximation error vs sequence length")
    xs = _draw(ax, labelled, "seq_len", "approx_rel_error")
    _axes(ax, "", "seq_len", "relative error (Frobenius)", log=(True, False), xs=xs)
    return fig


def error_vs_knob(frame: pd.DataFrame) -> Figure:
    """Approximation error against each variant's knob (n_hashes, window, n_features, k, ...).

    One panel per variant whose knob takes several values; lines are the other knobs and the
    lengths. Variants measured at a single knob value are named in the title instead.
    """
    swept, fixed = [], []
    for attention, (knob, *_) in KNOBS.items():
        rows = frame[frame["attention"] == attention]
        if rows.empty or knob not in frame:
            continue
        values = rows[knob].dropna().map(load.format_value).unique()
        if len(values) > 1:
            swept.append(attention)
        else:
            fixed.append(f"{attention} {knob.split('.', 1)[1]}={','.join(values)}")
    title = "Approximation error vs each variant's knob"
    if fixed:
        title += f"\n(one value only: {'; '.join(fixed)})"
    fig, axes = _figure(max(len(swept), 1), title, ncols=3)
    if not swept:
        _message(
            axes[0],
            "no variant's knob was swept in these results\n"
            "(e.g. +experiment=lsh, +experiment=linformer)",
        )
    for ax, attention in zip(axes, swept, strict=False):
        knob, *others = KNOBS[attention]
        rows = frame[(frame["attention"] == attention) & frame[knob].notna()]
        labelled, _ = series.with_series(
            rows.assign(variant=attention), x=knob, context=(*others, *series.CONTEXT)
        )
        values = sorted(labelled[knob].unique(), key=_knob_sort_key)
        labelled["knob_position"] = labelled[knob].map({v: i for i, v in enumerate(values)})
        _draw(ax, labelled, "knob_position", "approx_rel_error")
        _axes(ax, attention, knob.split(".", 1)[1], "relative error", log=(False, False))
        ax.set_xticks(range(len(values)), [load.format_value(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    return fig


def training_curves(
    frame: pd.DataFrame, curves: pd.DataFrame | None = None, seq_len: float | None = None
) -> Figure:
    """Training (solid) and eval (dashed) loss per step, and the final losses per series.

    Curves come from the W&B runs of the records (`load.load_curves`), at one seq_len (default:
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


def tradeoff(frame: pd.DataFrame, seq_len: float | None = None) -> Figure:
    """Quality vs speed vs memory at one seq_len, after the Long Range Arena paper's Figure 3.

    x: training-step time, y: eval accuracy (else eval loss, else train loss), marker area:
    peak memory. Series without a point at that length are listed with their status.
    Default length: the one with the most variants measured, the longest on a tie.
    """
    quality = next(
        (
            c
            for c in ("eval_accuracy", "eval_loss", "train_loss")
            if frame.loc[frame["status"] == "ok", c].notna().any()
        ),
        "eval_loss",
    )
    seq_len = _pick_length(frame, "step_ms") if seq_len is None else seq_len
    at_length = frame[frame["seq_len"] == seq_len] if seq_len is not None else frame
    labelled, _ = series.with_series(_with_mib(at_length), x="seq_len")
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (ax,) = _figure(1, f"Quality, speed and memory{length_note}\n(marker area ∝ peak memory)")
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(order)
    ok = labelled[labelled["status"] == "ok"]
    points = ok.groupby("series")[["step_ms", quality, "peak_memory_mib"]].mean()
    points = points[points["step_ms"].notna() & points[quality].notna()]
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
                v["step_ms"],
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
            name, (v["step_ms"], v[quality]), fontsize=7, xytext=(5, 5), textcoords="offset points"
        )
    if points.empty:
        _message(ax, "no training-step time with a loss in these results")
    if handles:
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.12),
            frameon=False,
            markerscale=0.5,
        )
    _axes(ax, "", "training step (ms)", quality.replace("_", " "), log=(not points.empty, False))
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
        xs = _draw(ax, labelled, "seq_len", metric)
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        _axes(
            ax, _PASS_TITLES[name], "seq_len", "fraction of matmul rate", log=(True, False), xs=xs
        )
    return fig


# --- Drawing helpers ------------------------------------------------------------------------


def _draw(
    ax: Axes, labelled: pd.DataFrame, x: str, y: str, notes: dict[str, str] | None = None
) -> list[float]:
    """Mean line with min..max band per series, failures at the top wall, a legend below.

    Returns every x drawn (values and failures), for `_axes` to fit the x range to.
    """
    stats = series.mean_spread(labelled, x, y)
    failed = series.failures(labelled, x)
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(order)
    handles = []
    _draw_failures(ax, failed, x, colors, order)
    for name in order:
        points = stats[stats["series"] == name]
        text = name + (f"  {notes[name]}" if notes and notes.get(name) else "")
        if not points.empty:
            (line,) = ax.plot(
                points[x],
                points["mean"],
                "o-",
                color=colors[name],
                markersize=4,
                linewidth=1.4,
                label=text,
            )
            if (points["n"] > 1).any():
                ax.fill_between(
                    points[x],
                    points["lo"],
                    points["hi"],
                    color=colors[name],
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
                    color=colors[name],
                    marker="v",
                    linestyle="none",
                    label=f"{name}: {_status_text(rows)} (no value)",
                )
            )
    if not handles:
        _message(ax, f"no {y} in these results")
    else:
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=1 if len(handles) < 8 else 2,
            frameon=False,
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


def _mark_crossover(
    ax: Axes, labelled: pd.DataFrame, name: str, metric: str, length: float
) -> None:
    """A star on the series' curve at the crossover length, with the length written by it."""
    points = series.mean_spread(labelled[labelled["series"] == name], "seq_len", metric)
    x, y = np.log(points["seq_len"].astype(float)), np.log(points["mean"].astype(float))
    at = float(np.exp(np.interp(np.log(length), x, y)))
    color = _colors(series.series_order(labelled))[name]
    ax.plot(length, at, "*", color=color, markersize=14, markeredgecolor="black", zorder=5)
    ax.annotate(
        f"L*≈{length:,.0f}",
        (length, at),
        fontsize=7,
        xytext=(6, -10),
        textcoords="offset points",
        color=color,
    )


def _draw_curves(ax: Axes, labelled: pd.DataFrame, curves: pd.DataFrame) -> None:
    """Per-step losses, mean over seeds with a min..max band."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(order)
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
        ax.legend(
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            frameon=False,
            ncol=1 if len(set(drawn)) < 8 else 2,
        )
    _axes(ax, "per step (solid: train, dashed: eval)", "step", "loss", log=(False, False))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_final_losses(ax: Axes, labelled: pd.DataFrame) -> None:
    """Final train (o) and eval (s) loss per series, mean with min..max whiskers; failures named."""
    order = series.series_order(labelled) if len(labelled) else []
    colors = _colors(order)
    _axes(ax, "final loss (o: train, ■: eval)", "", "loss", log=(False, False))
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
    if not order:
        _message(ax, "no records")
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
    """Scales, labels and grid; with `xs`, an x range holding them all, ticked at each if few."""
    ax.set_xscale("log" if log[0] else "linear")
    ax.set_yscale("log" if log[1] else "linear")
    if log[1]:  # plain numbers, also on minor ticks when the data span under two decades
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
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


def _message(ax: Axes, text: str) -> None:
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


def _colors(order: Sequence[str]) -> dict[str, tuple]:
    """Black for exact attention, then tab10 (tab20 beyond ten series)."""
    others = [s for s in order if not s.startswith(series.REFERENCE)]
    palette = colormaps["tab10" if len(others) <= 10 else "tab20"]
    colors = {s: palette(i % palette.N) for i, s in enumerate(others)}
    exact = [s for s in order if s.startswith(series.REFERENCE)]
    greys = colormaps["Greys"]
    for i, s in enumerate(exact):
        colors[s] = greys(1.0 - 0.5 * i / max(len(exact), 1))
    return colors


def _fit_note(f: scaling.SeriesFit) -> str:
    note = f"α={f.power_law}"
    if f.crossover is not None:
        note += f", L*{'=' if f.crossover.kind == fit.CROSSED else ''}{f.crossover}"
    return note


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
