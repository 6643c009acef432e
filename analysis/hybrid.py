"""report.md's table of hybrid stacks (`model.layers`, the `hybrid` preset): per stack, a
training step's time and peak memory against the all-full stack's at each length (the model's
crossover, not a kernel's), the whole model's decode per token and its state
(`decode_state_bytes`), and trained recall accuracy.

A stack is the record's `layers` ("3×deltanet+full"; a plain model's is its attention), with
the model's shape where it varies (block, depth, d_model, n_heads, n_kv_heads). The table reads
the sweeps that hold a hybrid stack (a record with `model.layers` set), so that the all-full
rows it compares against are those sweeps' own.
"""

from __future__ import annotations

import re

import pandas as pd

from analysis import accuracy, decode_report, series, table_command
from analysis.column_names import (
    DECODE_MS_PER_TOKEN,
    DECODE_STATE_BYTES,
    EVAL_ACCURACY,
    LAYERS,
    PEAK_MEMORY_BYTES,
    SEQ_LEN,
    STATUS,
    STEP_MS,
)
from analysis.load import format_value
from analysis.markdown_table import Table
from experiments.records.record import MIB

LAYERS_KEY = "model.layers"
# The model's shape: shown beside the stack where it varies among the hybrid sweeps' records.
SHAPE = ("block", "depth", "d_model", "n_heads", "n_kv_heads")
ALL_FULL = series.REFERENCE  # the stack every layer of which is exact attention


def hybrid_records(frame: pd.DataFrame) -> pd.DataFrame:
    """The records of the sweeps that hold a hybrid stack; empty if none does."""
    if LAYERS_KEY not in frame or LAYERS not in frame or not frame[LAYERS_KEY].notna().any():
        return frame.iloc[0:0]
    sweeps = frame.loc[frame[LAYERS_KEY].notna(), "sweep"].unique()
    return frame[frame["sweep"].isin(sweeps) & frame[LAYERS].notna()]


def entries(stack: str) -> list[str]:
    """The layers of a stack's repeating unit, in order, each with its options:
    "3×sliding_window(window=16)+full" -> [sliding_window(window=16) three times, full]."""
    names = []
    for part in str(stack).split("+"):
        match = re.fullmatch(r"(?:(\d+)×)?(.+)", part)
        count, entry = (int(match[1] or 1), match[2]) if match else (1, part)
        names += [entry] * count
    return names


def unit(stack: str) -> list[str]:
    """The variants of a stack's repeating unit, in order: "3×deltanet+full" -> [deltanet,
    deltanet, deltanet, full] (options dropped: "full(impl=math)" is full)."""
    return [entry.split("(", 1)[0].strip() for entry in entries(stack)]


def efficient_layer(stack: str) -> str:
    """The variant a stack is drawn as (its colour): its first layer that is not full; a plain
    variant's is itself, whatever its row's label adds ("full (depth 4)": full)."""
    return next((n for n in unit(stack) if n != ALL_FULL), ALL_FULL)


def full_share(stack: str) -> float:
    """The fraction of a stack's layers that are exact attention."""
    names = unit(stack)
    return names.count(ALL_FULL) / len(names)


def hybrid_table(frame: pd.DataFrame) -> Table | None:
    """Per stack (rows: the all-full stack first, then per efficient variant from every layer
    efficient to the most full): at each length a step's ms and peak MiB with their ratios to
    the all-full stack's, and the decode's ms per token and state; recall accuracy at each
    trained length and whether the stack learned."""
    records = hybrid_records(frame)
    if records.empty:
        return None
    shape = [c for c in SHAPE if c in records and records[c].dropna().map(str).nunique() > 1]
    keyed = records.assign(stack=records[[LAYERS, *shape]].apply(_stack_key, axis=1))
    cost = keyed[_measures_cost(keyed)]
    quality = series.trained_quality(keyed)
    quality = quality[quality[SEQ_LEN].notna()]
    if not quality.empty:
        quality = accuracy.with_learned(quality)
    lengths = sorted(cost[SEQ_LEN].dropna().unique())
    trained = sorted(quality[SEQ_LEN].unique())
    means = (
        cost[cost[STATUS] == "ok"]
        .groupby(["stack", SEQ_LEN])[[STEP_MS, PEAK_MEMORY_BYTES, DECODE_MS_PER_TOKEN]]
        .mean()
        .join(cost[cost[STATUS] == "ok"].groupby(["stack", SEQ_LEN])[DECODE_STATE_BYTES].max())
    )
    rows = []
    for stack in _order(keyed):
        mine = keyed[keyed["stack"] == stack].iloc[0]
        row = {"stack": mine[LAYERS], **{c: format_value(mine[c]) for c in shape}}
        reference = _reference(keyed, mine, shape)
        for length in lengths:
            at = _at(means, stack, length)
            full = _at(means, reference, length) if reference is not None else None
            failed = cost[(cost["stack"] == stack) & (cost[SEQ_LEN] == length)]
            row[f"step L={format_value(length)}"] = _step_cell(at, full, failed)
            row[f"decode L={format_value(length)}"] = _decode_cell(at)
        jobs = quality[quality["stack"] == stack]
        for length in trained:
            row[f"recall L={format_value(length)}"] = _accuracy_cell(jobs[jobs[SEQ_LEN] == length])
        if trained:
            row["learned"] = accuracy.learned_cell(jobs) if len(jobs) else "—"
        rows.append(row)
    note = (
        "Stacks of model.layers (`layers`: the repeating unit over the depth; a plain model's is "
        "its attention). Step: a training step's median ms · its peak MiB, each with its ratio "
        "to the all-full stack of the same shape at that length (below 1: cheaper); "
        "the length where the ratio falls below 1 is the model's crossover. Decode: ms per token "
        f"onto an L-token context ({decode_report.scope_text(cost)}) · "
        "decode_state_bytes, what the decoder keeps to generate the next token: "
        "a state flat across L is a fixed-state stack's. Recall: trained accuracy (%) on the "
        "records' recall task at each length (the shortest is the control), mean over seeds; "
        "learned: an evaluation reached "
        f"{accuracy.LEARNED:.0%}."
    )
    return Table("Hybrid stacks", pd.DataFrame(rows), note)


def _stack_key(row: pd.Series) -> str:
    return " ".join([str(row.iloc[0]), *(f"{k}={format_value(row[k])}" for k in row.index[1:])])


def _measures_cost(frame: pd.DataFrame) -> pd.Series:
    """The records of jobs that time a step, take its memory or decode (ended ok or not)."""
    switches = [c for c in ("measure.step", "measure.memory", "measure.decode") if c in frame]
    if not switches:  # no switches recorded: the records that hold a figure
        return frame[STEP_MS].notna() | frame[DECODE_MS_PER_TOKEN].notna()
    on = [frame[c].map(lambda v: v is True or v == 1) for c in switches]
    return pd.concat(on, axis=1).any(axis=1)


def _order(keyed: pd.DataFrame) -> list[str]:
    """All-full stacks first, then grouped by the efficient variant (in order of appearance),
    from every layer efficient to the most full."""
    stacks = list(dict.fromkeys(keyed["stack"]))
    labels = keyed.drop_duplicates("stack").set_index("stack")[LAYERS]
    efficient = {s: next((n for n in unit(labels[s]) if n != ALL_FULL), "") for s in stacks}
    first = list(dict.fromkeys(efficient.values()))
    return sorted(
        stacks,
        key=lambda s: (full_share(labels[s]) < 1, first.index(efficient[s]), full_share(labels[s])),
    )


def _reference(keyed: pd.DataFrame, mine: pd.Series, shape: list[str]) -> str | None:
    """The all-full stack of the same shape as `mine`, None if the records have none."""
    full = keyed[keyed[LAYERS].map(lambda s: full_share(s) == 1)]
    for column in shape:
        full = full[full[column].map(str) == str(mine[column])]
    return full["stack"].iloc[0] if len(full) else None


def _at(means: pd.DataFrame, stack: str, length) -> pd.Series | None:
    return means.loc[(stack, length)] if (stack, length) in means.index else None


def _ratio(value, reference) -> str:
    if reference is None or pd.isna(value) or pd.isna(reference) or not reference:
        return ""
    return f" ({value / reference:.2f}×)"


def _step_cell(at, full, failed: pd.DataFrame) -> str:
    if at is None or (pd.isna(at[STEP_MS]) and pd.isna(at[PEAK_MEMORY_BYTES])):
        statuses = failed.loc[failed[STATUS] != "ok", STATUS].unique()
        return ",".join(statuses) or "—"
    parts = []
    if pd.notna(at[STEP_MS]):
        parts.append(f"{_ms(at[STEP_MS])} ms" + _ratio(at[STEP_MS], _get(full, STEP_MS)))
    if pd.notna(at[PEAK_MEMORY_BYTES]):
        mib = at[PEAK_MEMORY_BYTES] / MIB
        parts.append(
            f"{mib:.3g} MiB" + _ratio(at[PEAK_MEMORY_BYTES], _get(full, PEAK_MEMORY_BYTES))
        )
    return " · ".join(parts)


def _decode_cell(at) -> str:
    if at is None or pd.isna(at[DECODE_MS_PER_TOKEN]):
        return "—"
    text = f"{_ms(at[DECODE_MS_PER_TOKEN])} ms"
    if pd.notna(at[DECODE_STATE_BYTES]):
        text += f" · {decode_report.cache_text(at[DECODE_STATE_BYTES])}"
    return text


def _ms(value: float) -> str:
    """ "66.3", "2,513": three digits, or whole milliseconds from a second up."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def _get(row, column):
    return None if row is None else row[column]


def _accuracy_cell(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "—"
    values = rows[EVAL_ACCURACY]
    if len(values) > 1:
        return f"{values.mean() * 100:.1f} ({values.min() * 100:.1f}–{values.max() * 100:.1f})"
    return f"{values.iloc[0] * 100:.1f}"


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.hybrid SWEEP_DIR...`: the Hybrid stacks table, as Markdown."""
    table_command.print_tables(
        "python -m analysis.hybrid",
        main.__doc__,
        [hybrid_table],
        "no hybrid stacks (model.layers) in these records",
        argv,
    )


if __name__ == "__main__":
    main()
