"""Figures of cost against sequence length: kernel time with fitted exponents, crossovers and
in-job speed-ups over SDPA, and the achieved FLOP rate."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import ScaledTranslation

from analysis import fit, series
from analysis import scaling_fits as scaling
from analysis.column_names import (
    ATTN_FWD_BWD_GFLOPS_PER_S,
    ATTN_FWD_BWD_MATMUL_FRACTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_GFLOPS_PER_S,
    MATMUL_FRACTION_WARNING,
    MATMUL_PEAK_GFLOPS_PER_S,
    SEQ_LEN,
    SPEEDUP_VS_SDPA,
    SPEEDUP_VS_SDPA_IQR,
)
from analysis.figures import style

_LABEL_ROWS = 3  # rows of crossover labels along the bottom of a panel, at most
_LABEL_ROW_PT = 14  # their height: a label of 7 points in its box, and a gap


_PASS_TITLES = {"fwd": "forward", "fwd+bwd": "forward + backward"}


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
    for ax, (name, metric) in zip(axes[:2], scaling.TIME_METRICS.items(), strict=True):
        fits = scaling.scaling_fits(labelled, keys, metric)
        notes = {s: _fit_note(f) for s, f in fits.items()}
        xs = style.draw_series(ax, labelled, SEQ_LEN, metric, notes=notes, min_points=2)
        crossed = {
            s: f.crossover.length
            for s, f in fits.items()
            if f.crossover is not None and f.crossover.kind == fit.CROSSED
        }
        if xs:
            marked.append((ax, _mark_crossovers(ax, labelled, metric, crossed)))
        style.label_axes(ax, _PASS_TITLES[name], SEQ_LEN, "time (ms)", log=(True, True), xs=xs)
    if speedups:
        _draw_speedups(axes[2], labelled, scaling.scaling_fits(labelled, keys, ATTN_FWD_BWD_MS))
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


def _draw_speedups(ax: Axes, labelled: pd.DataFrame, fits: dict[str, scaling.SeriesFit]) -> None:
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


def _fit_note(f: scaling.SeriesFit) -> str:
    note = f"α={f.power_law}"
    if f.crossover is not None:
        note += f", {_crossover_note(f.crossover)}"
    return note


def _crossover_note(c: fit.Crossover) -> str:
    """ "L*=1,469", "L*≈1,469 (uncertain)", "L*>4,096", "L*≤256"."""
    return f"L*{'=' if c.kind == fit.CROSSED and not c.uncertain else ''}{c}"


def flops_fraction(frame: pd.DataFrame) -> Figure:
    """Achieved attention GFLOP/s as a fraction of the machine's measured matmul rate.

    Forward+backward is the recorded fraction (per round against the matmul timed in the same
    round, `attn_fwd_bwd_matmul_fraction`) where a record has it; forward divides by the job's
    matmul rate. A fraction the job flagged (`matmul_fraction_warning`: above 1.05, a timing
    gone wrong) is drawn as a hollow marker, so it is not read as a kernel beating the machine.
    """
    rate = frame[MATMUL_PEAK_GFLOPS_PER_S]
    fwd_bwd = frame[ATTN_FWD_BWD_GFLOPS_PER_S] / rate
    if ATTN_FWD_BWD_MATMUL_FRACTION in frame:
        fwd_bwd = frame[ATTN_FWD_BWD_MATMUL_FRACTION].astype(float).fillna(fwd_bwd)
    with_fraction = frame.assign(
        fwd_fraction=frame[ATTN_FWD_GFLOPS_PER_S] / rate, fwd_bwd_fraction=fwd_bwd
    )
    labelled, _ = series.with_series(with_fraction, x=SEQ_LEN)
    peak = rate.median()
    peak_note = f"{peak:.0f} GFLOP/s" if np.isfinite(peak) else "not measured"
    fig, axes = style.new_figure(2, f"Achieved useful FLOP/s ÷ measured matmul rate ({peak_note})")
    for ax, (name, metric) in zip(
        axes, (("fwd", "fwd_fraction"), ("fwd+bwd", "fwd_bwd_fraction")), strict=True
    ):
        flagged = _flagged(labelled) if name == "fwd+bwd" else labelled.iloc[0:0]
        extra = [_hollow_handle()] if len(flagged) else []
        xs = style.draw_series(ax, labelled, SEQ_LEN, metric, min_points=2, extra_handles=extra)
        if xs:
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
            _hollow(ax, labelled, flagged)
        style.label_axes(
            ax, _PASS_TITLES[name], SEQ_LEN, "fraction of matmul rate", log=(True, False), xs=xs
        )
    return style.finish(fig)


def _hollow_handle() -> Line2D:
    """The legend's line for a flagged fraction's hollow marker."""
    return Line2D(
        [],
        [],
        linestyle="none",
        marker="o",
        markerfacecolor="white",
        markeredgecolor="dimgrey",
        label="hollow: above 1.05 of the matmul, a timing warning (not a real rate)",
    )


def _flagged(labelled: pd.DataFrame) -> pd.DataFrame:
    """The records whose forward+backward fraction the job flagged (`matmul_fraction_warning`)."""
    if MATMUL_FRACTION_WARNING not in labelled:
        return labelled.iloc[0:0]
    return labelled[labelled[MATMUL_FRACTION_WARNING].fillna(False).astype(bool)]


def _hollow(ax: Axes, labelled: pd.DataFrame, flagged: pd.DataFrame) -> None:
    """A hollow marker over each flagged forward+backward fraction (its legend line:
    `_hollow_handle`)."""
    styles = style.series_styles(labelled)
    for name, rows in flagged.groupby("series", sort=False):
        ax.plot(
            rows[SEQ_LEN],
            rows["fwd_bwd_fraction"],
            linestyle="none",
            marker=styles[name]["marker"],
            markersize=9,
            markerfacecolor="white",
            markeredgecolor=styles[name]["color"],
            markeredgewidth=1.5,
            zorder=6,
        )
