"""The peak-memory section of report.md (`SECTION`): peak memory against sequence length (the
attention kernel alone and a whole training step, `memory_vs_seq_len`), and peak memory and step
time against depth per block type, as a figure (`depth`) and a table (`depth_table`) of the
series measured at two depths or more."""

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
    STATUS,
    STEP_MS,
)
from analysis.figures import style
from analysis.load import format_value
from analysis.markdown_table import Table, with_keys
from analysis.section import FigureSpec, Section, TableSpec
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


def depth_table(frame: pd.DataFrame) -> Table | None:
    """Peak memory and step time per block type and depth, for the series measured at two depths
    or more (as the depth figure)."""
    labelled, keys = series.with_series(frame, x=DEPTH)
    ok = labelled[(labelled[STATUS] == "ok") & labelled[DEPTH].notna()]
    if ok[DEPTH].nunique() < 2:
        return None
    depths_per_series = labelled.groupby("series")[DEPTH].nunique()
    swept = labelled["series"].isin(depths_per_series[depths_per_series > 1].index)
    labelled, keys = series.with_series(frame[swept], x=DEPTH)  # keys of these series only
    memory = series.mean_spread(labelled, DEPTH, PEAK_MEMORY_BYTES)
    step = series.mean_spread(labelled, DEPTH, STEP_MS)
    failed = series.failures(labelled, DEPTH)
    depths = sorted(labelled[DEPTH].dropna().unique())
    rows = []
    for name in series.series_order(labelled):
        row = {"series": name}
        for d in depths:
            row[f"depth {format_value(d)}"] = _depth_cell(name, d, memory, step, failed)
        rows.append(row)
    note = "Each cell: peak memory of one training step (MiB) / its time (ms), mean over seeds."
    return Table("Memory and time vs depth", with_keys(rows, labelled, keys), note)


def _depth_cell(name: str, depth: float, memory, step, failed) -> str:
    def at(stats: pd.DataFrame) -> pd.DataFrame:
        return stats[(stats["series"] == name) & (stats[DEPTH] == depth)]

    mem, time = at(memory), at(step)
    if mem.empty and time.empty:
        return ",".join(at(failed)[STATUS].unique()) or "—"
    mem_text = f"{mem['mean'].iloc[0] / MIB:.1f}" if len(mem) else "—"
    time_text = f"{time['mean'].iloc[0]:.0f}" if len(time) else "—"
    return f"{mem_text} / {time_text}"


SECTION = Section(
    "Peak memory",
    tables=(TableSpec(depth_table),),
    figures={
        "memory_vs_seq_len": FigureSpec(
            memory_vs_seq_len,
            "Peak memory against sequence length (log-log): the attention kernel alone "
            "(forward+backward, with its saved activations and input gradients) and a whole "
            "training step; legend: fitted exponent α.",
        ),
        "depth": FigureSpec(depth, "Peak memory and step time against depth per block type."),
    },
)
