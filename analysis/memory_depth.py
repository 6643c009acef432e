"""report.md's table of memory and step time against depth per block type (`depth_table`),
the numbers of the depth figure (`analysis.figures.peak_memory.depth`).
"""

from __future__ import annotations

import pandas as pd

from analysis import series
from analysis.column_names import DEPTH, PEAK_MEMORY_BYTES, STATUS, STEP_MS
from analysis.load import format_value
from analysis.markdown_table import Table, with_keys
from experiments.records.record import MIB


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
