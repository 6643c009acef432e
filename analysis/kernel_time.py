"""The kernel-time section of report.md (`SECTION`): how each variant's kernel time scales with
the length, and from which length it is faster than exact attention.

Tables: per variant (`variant_summary`: exponents, crossovers, reach, and time, memory and error
at the longest length every series reached) and the speed-ups each job measured against exact
attention (`speedups`). Figure: kernel time against sequence length with fitted exponents and
crossovers, beside those speed-ups (`time_vs_seq_len`). The fits they read:
`analysis.scaling_fits`; the command that prints the speed-ups: `analysis.crossovers`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

from analysis import fit, series
from analysis.column_names import (
    APPROX_REL_ERROR,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    ATTN_FWD_MS,
    PEAK_MEMORY_BYTES,
    SEQ_LEN,
    SPEEDUP_VS_SDPA,
    SPEEDUP_VS_SDPA_IQR,
    STATUS,
    SWAP_DELTA_BITS_PER_BYTE,
)
from analysis.figures import style
from analysis.markdown_table import Table, format_length, informative, with_keys
from analysis.scaling_fits import TAIL, TIME_METRICS, SeriesFit, longest_common_length, scaling_fits
from analysis.section import FigureSpec, Section, TableSpec
from experiments.records.record import MIB

# The per-variant table's columns at the longest common length: metric, title, scale, format.
AT_LONGEST = (
    (ATTN_FWD_MS, "fwd (ms)", 1, ".3g"),
    (ATTN_FWD_BWD_MS, "fwd+bwd (ms)", 1, ".3g"),
    (ATTN_FWD_BWD_PEAK_BYTES, "kernel memory (MiB)", MIB, ".1f"),
    (PEAK_MEMORY_BYTES, "step memory (MiB)", MIB, ".1f"),
    (APPROX_REL_ERROR, "rel. error", 1, ".3g"),
    (SWAP_DELTA_BITS_PER_BYTE, "swap Δ bits/byte", 1, ".3g"),
)


def variant_summary(frame: pd.DataFrame) -> Table | None:
    """Per series: exponents, crossover against exact attention, reach, kernel time, memory and
    error at the longest length every series reached. Columns without a value are left out."""
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    if labelled.empty:
        return None
    fits = {name: scaling_fits(labelled, keys, metric) for name, metric in TIME_METRICS.items()}
    quadratic = scaling_fits(labelled, keys, ATTN_FWD_BWD_MS, baseline=series.QUADRATIC)
    at_longest = [spec for spec in AT_LONGEST if spec[0] in labelled]  # older records lack some
    at = {
        metric: (
            longest_common_length(labelled, metric),
            series.mean_spread(labelled, SEQ_LEN, metric),
        )
        for metric, *_ in at_longest
    }
    several_lengths = labelled[SEQ_LEN].dropna().nunique() > 1
    rows = []
    for name in series.series_order(labelled):
        mine = labelled[labelled["series"] == name]
        fwd, fwd_bwd = fits["fwd"][name], fits["fwd+bwd"][name]
        row = {
            "series": name,
            "α fwd": str(fwd.power_law),
            "α fwd+bwd": str(fwd_bwd.power_law),
            f"α fwd+bwd, longest {TAIL} L": str(fwd_bwd.tail_power_law),
            "L* fwd": _crossover(fwd, name),
            "L* fwd+bwd": _crossover(fwd_bwd, name),
        }
        if any(f.crossover is not None for f in quadratic.values()):
            crossover = quadratic[name].crossover
            row["L* fwd+bwd vs O(L²)"] = "—" if crossover is None else str(crossover)
        if several_lengths:
            row["longest L ok"] = _longest_ok(mine)
        row["failed at"] = _first_failures(mine)
        for metric, title, scale, spec in at_longest:
            length, stats = at[metric]
            if length is not None:
                row[f"{title} @ L={format_length(length)}"] = _value_at(
                    stats, name, length, scale, spec
                )
        rows.append(row)
    table = informative(with_keys(rows, labelled, keys), also_empty=("reference",))
    notes = []
    if any(c.startswith("α") for c in table):
        notes.append(
            "α: least-squares slope of log(kernel time) against log(seq_len), over the mean per "
            f"length (all lengths, and the {TAIL} longest: the asymptotic regime)."
        )
    if any(c.startswith("L*") for c in table):
        notes.append(
            "L*: the length above which the variant's kernel is faster than exact attention "
            "(SDPA, same shape and causality), from the speed-up each job measured in rounds "
            "alternating the kernel with exact attention (`speedup_vs_sdpa`, median of the "
            "per-round ratios; records without it: against exact attention's own jobs), "
            "log-interpolated between measured lengths; ≤x: faster at every measured length; "
            ">x: still slower at the longest; (exact oom): exact attention failed there; "
            "(uncertain): the rounds' spread at the deciding lengths is wider than the "
            "speed-up's distance from 1. vs O(L²): against exact attention with explicit L×L "
            "scores (impl=math, `speedup_vs_math`: measured in the job, or chained through the "
            "O(L²) form's own job at that length as speedup_vs_sdpa / its speedup_vs_sdpa)."
        )
    if any("memory" in c for c in table):
        notes.append(
            "kernel memory: peak live tensors of the attention kernel alone in one "
            "forward+backward (saved activations, output, input gradients); step memory: of a "
            "whole training step."
        )
    if any(" @ L=" in c for c in table):
        notes.append(
            "@ L: at the longest length every series measuring that column reached; kernel "
            "times are medians of the kernel alone."
        )
    return Table("Per variant", table, " ".join(notes))


def speedups(frame: pd.DataFrame) -> Table | None:
    """Per series: the in-job speed-up over SDPA (forward+backward) at each length as "median
    (IQR)", and the crossovers it gives (against SDPA forward+backward and forward, and
    against the O(L²) form where measured). None when no record has `speedup_vs_sdpa`."""
    column = SPEEDUP_VS_SDPA
    if column not in frame or frame[column].isna().all():
        return None
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    median = series.mean_spread(labelled, SEQ_LEN, column)
    spread = SPEEDUP_VS_SDPA_IQR
    iqr = series.mean_spread(labelled, SEQ_LEN, spread) if spread in labelled else median
    against = {
        "L* vs SDPA": (ATTN_FWD_BWD_MS, series.FUSED),
        "L* fwd vs SDPA": (ATTN_FWD_MS, series.FUSED),
        "L* vs O(L²)": (ATTN_FWD_BWD_MS, series.QUADRATIC),
    }
    fits = {
        title: scaling_fits(labelled, keys, metric, baseline=baseline)
        for title, (metric, baseline) in against.items()
    }
    lengths = sorted(median[SEQ_LEN].unique())
    rows = []
    for name in series.series_order(labelled):
        mine = median[median["series"] == name].set_index(SEQ_LEN)["mean"]
        if mine.empty or fits["L* vs SDPA"][name].crossover is None:
            continue  # SDPA itself, or no speed-ups measured
        spreads = iqr[iqr["series"] == name].set_index(SEQ_LEN)["mean"]
        row = {"series": name}
        for title, fitted in fits.items():
            crossover = fitted[name].crossover
            row[title] = "—" if crossover is None else str(crossover)
        for length in lengths:
            cell = "—"
            if length in mine.index:
                cell = f"{mine[length]:.2f}"
                if spread in labelled and length in spreads.index:
                    cell += f" ({spreads[length]:.2f})"
            row[f"L={format_length(length)}"] = cell
        rows.append(row)
    if not rows:
        return None
    note = (
        "Speed-up: exact attention's time / the kernel's (forward+backward) in the same round, "
        "the median over rounds that alternate the kernel with SDPA (and the O(L²) form) in "
        "each job, with the ratios' interquartile range in brackets; above 1 the kernel is "
        "faster. L* is where it crosses 1, interpolated in log L; (uncertain): the spread at "
        "the deciding lengths is wider than the distance from 1."
    )
    table = informative(with_keys(rows, labelled, keys))
    return Table("Speed-up over exact attention, measured in each job", table, note)


def _crossover(f: SeriesFit, name: str) -> str:
    if f.crossover is not None:
        return str(f.crossover)
    # No crossover: exact attention is the reference itself; any other series had no
    # measurement to compare (e.g. every job skipped).
    return "reference" if name.startswith(series.REFERENCE) else "—"


def _longest_ok(rows: pd.DataFrame) -> str:
    ok = rows.loc[rows[STATUS] == "ok", SEQ_LEN].dropna()
    return format_length(ok.max()) if len(ok) else "—"


def _first_failures(rows: pd.DataFrame) -> str:
    """The status at the shortest failed length, e.g. "oom at 8,192"."""
    failed = rows[rows[STATUS] != "ok"].dropna(subset=[SEQ_LEN])
    if failed.empty:
        return ""
    shortest = failed[SEQ_LEN].min()
    statuses = ",".join(dict.fromkeys(failed.loc[failed[SEQ_LEN] == shortest, STATUS]))
    return f"{statuses} at {format_length(shortest)}"


def _value_at(stats: pd.DataFrame, name: str, length, scale: float, spec: str = ".1f") -> str:
    if length is None:
        return "—"
    match = stats[(stats["series"] == name) & (stats[SEQ_LEN] == length)]
    return format(match["mean"].iloc[0] / scale, spec) if len(match) else "—"


_LABEL_ROWS = 3  # rows of crossover labels along the bottom of a panel, at most
_LABEL_ROW_PT = 14  # their height: a label of 7 points in its box, and a gap


PASS_TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward"}


def time_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Kernel time against seq_len, log-log, forward and forward+backward, and (when the jobs
    measured it) the kernel's speed-up over SDPA against seq_len.

    The legend gives each series' fitted exponent α (all lengths) and its crossover length L*
    against exact attention; a crossover inside the measured range is a star on the curve.
    """
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    speedups = SPEEDUP_VS_SDPA in labelled and labelled[SPEEDUP_VS_SDPA].notna().any()
    fig, axes = style.new_figure(3 if speedups else 2, "Attention kernel time vs sequence length")
    marked = []
    for ax, (name, metric) in zip(axes[:2], TIME_METRICS.items(), strict=True):
        fits = scaling_fits(labelled, keys, metric)
        notes = {s: _fit_note(f) for s, f in fits.items()}
        xs = style.draw_series(ax, labelled, SEQ_LEN, metric, notes=notes, min_points=2)
        crossed = {
            s: f.crossover.length
            for s, f in fits.items()
            if f.crossover is not None and f.crossover.kind == fit.CROSSED
        }
        if xs:
            marked.append((ax, _mark_crossovers(ax, labelled, metric, crossed)))
        style.label_axes(ax, PASS_TITLES[name], SEQ_LEN, "time (ms)", log=(True, True), xs=xs)
    if speedups:
        _draw_speedups(axes[2], labelled, scaling_fits(labelled, keys, ATTN_FWD_BWD_MS))
    style.finish(fig)
    noted = False
    for ax, (labels, stars) in marked:
        left_out = style.place_labels(ax, labels, avoid=stars)
        if left_out:
            ax.set_title(
                f"{ax.get_title()}\n({len(left_out)} of {len(labels)} L* labels left out for "
                "room: every L* is in the legend)",
                fontsize=9,
            )
            noted = True
    return style.finish(fig) if noted else fig


def _draw_speedups(ax: Axes, labelled: pd.DataFrame, fits: dict[str, SeriesFit]) -> None:
    """Each series' in-job speed-up over SDPA (forward+backward) against seq_len, log-log: the
    median over rounds (mean over records) with a band of ± half its interquartile range,
    a line at 1 (above: faster than SDPA), and a star at each crossover on it."""
    spread = SPEEDUP_VS_SDPA_IQR
    with_band = labelled.assign(
        _iqr=labelled[spread] if spread in labelled else 0.0,
    )
    stats = series.mean_spread(with_band, SEQ_LEN, SPEEDUP_VS_SDPA)
    iqr = series.mean_spread(with_band, SEQ_LEN, "_iqr").set_index(["series", SEQ_LEN])["mean"]
    styles = style.series_styles(labelled)
    xs = []
    for name in series.series_order(labelled):
        points = stats[stats["series"] == name]
        if points.empty or name not in fits or fits[name].crossover is None:
            continue  # exact attention (SDPA itself) or a series without speed-ups
        half = np.array([iqr.get((name, x), 0.0) / 2 for x in points[SEQ_LEN]])
        c = fits[name].crossover
        ax.plot(
            points[SEQ_LEN],
            points["mean"],
            **styles[name],
            markersize=4,
            linewidth=1.4,
            label=f"{name}  {_crossover_note(c)}",
        )
        lower = np.maximum(points["mean"] - half, points["mean"] * 0.05)
        ax.fill_between(
            points[SEQ_LEN],
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
        xs += [float(v) for v in points[SEQ_LEN]]
    if not xs:
        style.message(ax, f"no {SPEEDUP_VS_SDPA} in these results")
        style.label_axes(ax, "", SEQ_LEN, "speed-up", log=(False, False))
        return
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    style.legend_below(ax, ncol=2, handlelength=3)
    style.label_axes(
        ax,
        "speed-up over SDPA, forward + backward (in-job rounds; band ± IQR/2)",
        SEQ_LEN,
        "SDPA time / kernel time",
        log=(True, True),
        xs=xs,
    )


def _mark_crossovers(
    ax: Axes, labelled: pd.DataFrame, metric: str, crossed: dict[str, float]
) -> tuple[list, list]:
    """A star on each series' curve at its crossover length, and its "L*≈…" label under it along
    the bottom of the panel, joined to the star by a dotted line. Returns the labels, each with
    its places (the lowest of `_LABEL_ROWS` rows first), and the stars, for `style.place_labels`
    to keep a label only where it overlaps no other label and no star."""
    styles = style.series_styles(labelled)
    labels, stars = [], []
    for name, length in sorted(crossed.items(), key=lambda item: item[1]):
        points = series.mean_spread(labelled[labelled["series"] == name], SEQ_LEN, metric)
        x, y = np.log(points[SEQ_LEN].astype(float)), np.log(points["mean"].astype(float))
        at = float(np.exp(np.interp(np.log(length), x, y)))
        color = styles[name]["color"]
        (star,) = ax.plot(
            length, at, "*", color=color, markersize=14, markeredgecolor="black", zorder=5
        )
        label = ax.annotate(
            f"L*≈{length:,.0f}",
            xy=(length, at),
            xytext=(length, 0),
            textcoords=_row(ax, 0),
            fontsize=7,
            color=color,
            ha="center",
            va="bottom",
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": color},
            arrowprops={"arrowstyle": "-", "color": color, "linestyle": ":", "linewidth": 0.8},
        )
        rows = [((length, 0), _row(ax, row), "center", "bottom") for row in range(_LABEL_ROWS)]
        labels.append((label, rows))
        stars.append(star)
    return labels, stars


def _row(ax: Axes, row: int):
    """x in data, y `row` label rows up from the panel's lower edge (in points: rows keep their
    height whatever size the panel is laid out at)."""
    up = (4 + row * _LABEL_ROW_PT) / 72
    return ax.get_xaxis_transform() + ScaledTranslation(0, up, ax.figure.dpi_scale_trans)


def _fit_note(f: SeriesFit) -> str:
    note = f"α={f.power_law}"
    if f.crossover is not None:
        note += f", {_crossover_note(f.crossover)}"
    return note


def _crossover_note(c: fit.Crossover) -> str:
    """ "L*=1,469", "L*≈1,469 (uncertain)", "L*>4,096", "L*≤256"."""
    return f"L*{'=' if c.kind == fit.CROSSED and not c.uncertain else ''}{c}"


SECTION = Section(
    "Kernel time and speed-ups over exact attention",
    tables=(TableSpec(variant_summary), TableSpec(speedups)),
    figures={
        "time_vs_seq_len": FigureSpec(
            time_vs_seq_len,
            "Kernel time against sequence length (log-log), forward and "
            "forward+backward; legend: fitted exponent α and crossover L* against "
            "exact attention (star), from the speed-ups each job measured in rounds alternating "
            "the kernel with SDPA; third panel: those speed-ups (band: ± half their IQR).",
        ),
    },
)
