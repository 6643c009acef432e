"""The FLOP-rate section of report.md (`SECTION`): the kernel's achieved useful GFLOP/s as a
fraction of the matmul rate measured on the same machine (`flops_fraction`), forward and
forward+backward against sequence length; a fraction the job flagged is drawn hollow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import series
from analysis.column_names import (
    ATTN_FWD_BWD_GFLOPS_PER_S,
    ATTN_FWD_BWD_MATMUL_FRACTION,
    ATTN_FWD_GFLOPS_PER_S,
    MATMUL_FRACTION_WARNING,
    MATMUL_PEAK_GFLOPS_PER_S,
    SEQ_LEN,
)
from analysis.figures import style
from analysis.kernel_time import PASS_TITLES
from analysis.section import FigureSpec, Section


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
            ax, PASS_TITLES[name], SEQ_LEN, "fraction of matmul rate", log=(True, False), xs=xs
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


SECTION = Section(
    "Achieved FLOP rate",
    figures={
        "flops_fraction": FigureSpec(
            flops_fraction,
            "Achieved useful GFLOP/s of the kernel as a fraction of the measured matmul rate.",
        ),
    },
)
