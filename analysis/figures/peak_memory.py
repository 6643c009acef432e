"""Figures of memory: peak memory against sequence length (the kernel alone and a whole step),
and memory and step time against depth per block type."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import scaling_fits as scaling
from analysis import series
from analysis.column_names import (
    ATTN_FWD_BWD_PEAK_BYTES,
    DEPTH,
    PEAK_MEMORY_BYTES,
    SEQ_LEN,
    STEP_MS,
)
from analysis.figures import style
from experiments.records.record import MIB

# The two memories a reader compares: what the kernel alone holds, and the whole step.
MEMORY_PANELS = (
    (ATTN_FWD_BWD_PEAK_BYTES, "Attention kernel alone, forward+backward"),
    (PEAK_MEMORY_BYTES, "Training step (whole model)"),
)


def memory_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Peak memory (MiB of live tensors) against seq_len, log-log, with fitted exponents: the
    attention kernel's own forward+backward, and a whole training step. A panel whose column
    was not measured (records older than the kernel measure) is left out."""
    panels = [(c, t) for c, t in MEMORY_PANELS if c in frame and frame[c].notna().any()]
    panels = panels or list(MEMORY_PANELS[-1:])  # nothing measured: one empty panel, not drawn
    fig, axes = style.new_figure(len(panels), "Peak memory vs sequence length")
    for ax, (column, title) in zip(axes, panels, strict=True):
        mib = frame.assign(mib=frame[column] / MIB)
        labelled, keys = series.with_series(mib, x=SEQ_LEN)
        fits = scaling.scaling_fits(labelled, keys, "mib")
        notes = {s: f"α={f.power_law}" for s, f in fits.items()}
        xs = style.draw_series(ax, labelled, SEQ_LEN, "mib", notes=notes, min_points=2)
        style.label_axes(
            ax, title, SEQ_LEN, "peak memory (MiB, live tensors)", log=(True, True), xs=xs
        )
    return style.finish(fig)


def depth(frame: pd.DataFrame) -> Figure:
    """Peak memory and training-step time against depth, one series per block type.

    Only series measured at two depths or more are drawn: the others belong to other sweeps.
    """
    labelled, _ = series.with_series(_with_mib(frame), x=DEPTH)
    depths_per_series = labelled.groupby("series")[DEPTH].nunique()
    swept = depths_per_series[depths_per_series > 1].index
    labelled = labelled[labelled["series"].isin(swept)]
    title = "Memory and time vs depth"
    left_out = len(depths_per_series) - len(swept)
    if left_out:
        title += f" ({left_out} series measured at one depth only are left out)"
    fig, axes = style.new_figure(2, title)
    for ax, (metric, ylabel) in zip(
        axes,
        (("peak_memory_mib", "peak memory (MiB)"), (STEP_MS, "training step (ms)")),
        strict=True,
    ):
        if labelled.empty:
            style.message(ax, "depth was not swept in these results: run +experiment=depth")
        xs = style.draw_series(ax, labelled, DEPTH, metric) if len(labelled) else []
        style.label_axes(ax, "", "depth (layers)", ylabel, log=(False, False), xs=xs)
    return style.finish(fig)


def _with_mib(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(peak_memory_mib=frame[PEAK_MEMORY_BYTES] / MIB)
