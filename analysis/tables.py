"""report.md's tables: each builder takes the results frame and returns a `Table`, or None when
the results hold nothing for it (so a report shows only the tables its sweep can fill).

A row of configurations starts with `variant` and one column per key that varies in the
results (`series.key_values`: the attention's varying options, then block, depth, threads, ...),
so what was swept is always visible; a column with nothing to say (no fit, no reference, not
measured) is left out rather than filled with dashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis import accuracy, scaling_fits, series, tuning
from analysis.columns import (
    APPROX_REL_ERROR,
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    ATTN_FWD_MS,
    BATCH_SIZE,
    CAUSAL,
    D_MODEL,
    DEPTH,
    DEVICE,
    DEVICE_NAME,
    DTYPE,
    ERROR,
    EVAL_ACCURACY,
    EVAL_BITS_PER_BYTE,
    EVAL_LOSS,
    GIT_COMMIT,
    HOSTNAME,
    JOB,
    KERNEL_PATH,
    LEARNED,
    N_HEADS,
    PEAK_MEMORY_BYTES,
    SEED,
    SEQ_LEN,
    SHARED_QK,
    SPEEDUP_VS_SDPA,
    SPEEDUP_VS_SDPA_IQR,
    STATUS,
    STEP_MS,
    SWAP_DELTA_BITS_PER_BYTE,
    SWEEP,
    TASK,
    THREADS,
    TIMESTAMP,
    TIMING_WARNING,
    TOKENS_PER_S,
    TORCH_VERSION,
)
from analysis.load import format_value
from experiments.records import record
from experiments.records.record import MIB
from experiments.records.store import task_metrics

EMPTY = ("", "—", "n/a")  # cells that say nothing
# What a kernel's time depends on: records agreeing on all of these time the same kernel, so
# their times must agree (a different block, depth or task cannot matter to the kernel alone).
KERNEL_INPUTS = (
    SEQ_LEN,
    BATCH_SIZE,
    N_HEADS,
    D_MODEL,
    CAUSAL,
    DTYPE,
    DEVICE,
    THREADS,
    SHARED_QK,
    HOSTNAME,
    SWEEP,
)
KERNEL_DISAGREEMENT = 3.0  # a kernel time this many times the same kernel's fastest is flagged


@dataclass(frozen=True)
class Table:
    """A titled table with an explanatory note, rendered as GitHub-flavoured Markdown."""

    title: str
    frame: pd.DataFrame
    note: str = ""

    def markdown(self) -> str:
        header = "| " + " | ".join(_cell(c) for c in self.frame.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.frame.columns) + "|"
        body = [
            "| " + " | ".join(_cell(v) for v in row) + " |"
            for row in self.frame.itertuples(index=False)
        ]
        note = f"\n{self.note}\n" if self.note else ""
        return "\n".join([f"## {self.title}", "", header, rule, *body, note])


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
    fits = {
        name: scaling_fits.scaling_fits(labelled, keys, metric)
        for name, metric in scaling_fits.TIME_METRICS.items()
    }
    quadratic = scaling_fits.scaling_fits(
        labelled, keys, ATTN_FWD_BWD_MS, baseline=series.QUADRATIC
    )
    at_longest = [spec for spec in AT_LONGEST if spec[0] in labelled]  # older records lack some
    at = {
        metric: (
            scaling_fits.longest_common_length(labelled, metric),
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
            f"α fwd+bwd, longest {scaling_fits.TAIL} L": str(fwd_bwd.tail_power_law),
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
                row[f"{title} @ L={_length(length)}"] = _value_at(stats, name, length, scale, spec)
        rows.append(row)
    table = _informative(_with_keys(rows, labelled, keys), also_empty=("reference",))
    notes = []
    if any(c.startswith("α") for c in table):
        notes.append(
            "α: least-squares slope of log(kernel time) against log(seq_len), over the mean per "
            f"length (all lengths, and the {scaling_fits.TAIL} longest: the asymptotic regime)."
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
        title: scaling_fits.scaling_fits(labelled, keys, metric, baseline=baseline)
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
            row[f"L={_length(length)}"] = cell
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
    table = _informative(_with_keys(rows, labelled, keys))
    return Table("Speed-up over exact attention, measured in each job", table, note)


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
    return Table("Memory and time vs depth", _with_keys(rows, labelled, keys), note)


def failures(frame: pd.DataFrame) -> Table | None:
    """Every configuration that did not end ok, grouped by variant, status and reason."""
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    failed = labelled[labelled[STATUS] != "ok"]
    if failed.empty:
        return None
    rows = []
    for (name, status, reason), group in failed.groupby(
        ["series", STATUS, failed[ERROR].map(lambda e: "" if e is None else str(e))],
        sort=False,
    ):
        rows.append(
            {
                "series": name,
                STATUS: status,
                SEQ_LEN: ", ".join(_length(v) for v in sorted(group[SEQ_LEN].dropna().unique())),
                "records": len(group),
                "reason": reason[:160] + ("…" if len(reason) > 160 else ""),
            }
        )
    not_ok = ", ".join(s for s in record.STATUSES if s != record.OK)
    return Table(f"Not measured ({not_ok})", _with_keys(rows, labelled, keys))


def cross_evaluation(frame: pd.DataFrame) -> Table | None:
    """Rows: the kernel a model was trained with; columns: the kernel it was evaluated with.

    Reformer Table 2's layout, from records carrying `eval_accuracy@<label>` columns (the
    runner's `eval.attention` evaluations). The row label is the preset's `train_as` when
    present, else the attention name. Values are accuracy in percent, mean over seeds.
    """
    labels = [c.split("@", 1)[1] for c in frame.columns if c.startswith("eval_accuracy@")]
    ok = frame[frame[STATUS] == "ok"]
    if not labels or ok.empty:
        return None
    if "train_as" in ok:
        rows = ok["train_as"]
    else:  # records from before `train_as` was recorded: the kernel and its rounds
        rounds = ok.get("attention.n_hashes", pd.Series(index=ok.index, dtype=float))
        rows = ok[ATTENTION] + rounds.map(lambda n: "" if pd.isna(n) else f"-{int(n)}")
    table = (
        ok[[f"eval_accuracy@{label}" for label in labels]]
        .groupby(rows.rename("trained with"), sort=False)
        .mean()
        .mul(100)
        .round(1)
    )
    table.columns = [f"eval {label}" for label in labels]
    note = (
        "Accuracy (%) on the evaluation batches; each row is one trained model evaluated with "
        "every kernel (Reformer Table 2's layout), the mean over seeds."
    )
    return Table("Trained with × evaluated with", table.reset_index(), note)


# Final quality columns, the first present being the one compared; lower is better except
# accuracy.
QUALITY = {
    EVAL_BITS_PER_BYTE: "eval bits/byte",
    EVAL_ACCURACY: "eval accuracy (%)",
    EVAL_LOSS: "eval loss",
}
COST = {
    STEP_MS: "step (ms)",
    PEAK_MEMORY_BYTES: "peak memory (MiB)",
    TOKENS_PER_S: "train tokens/s",
}


def quality(frame: pd.DataFrame) -> Table | None:
    """Final quality and cost per trained configuration, relative to the first (exact) one.

    The table of the quality reproductions (shared vs separate QK, reversible vs residual, Linformer
    k and LSH rounds): one row per series (`series.with_series`: the variant plus whichever of
    block, shared_qk, task, ... vary), mean over seeds, and the relative difference of the first
    quality metric from the first row's. Records of tasks without a quality signal (random_lm)
    and of jobs that did not train are left out. Of a learning-rate grid, each series' chosen
    rate's records only (`series.trained_quality`), the rate and its grid in the row.
    """
    trained = frame[(frame[STATUS] == "ok") & ~frame[TASK].isin(series.NO_QUALITY_TASKS)]
    metrics = [m for m in QUALITY if m in trained and trained[m].notna().any()]
    if trained.empty or not metrics:
        return None
    trained = series.trained_quality(frame, metrics[0])
    if trained[SEQ_LEN].nunique() > 1:
        return None  # one row per length and series: `quality_by_length`
    labelled, keys = series.with_series(trained)
    own_names = "train_as" in labelled and labelled["train_as"].notna().all()
    if own_names:
        labelled["series"] = labelled["train_as"]  # the preset's own row names
    evaluations = [  # the task's metrics with other kernels (`eval.attention`), when recorded
        m for m in task_metrics(labelled.columns) if "@" in m and labelled[m].notna().any()
    ]
    costs = [c for c in COST if c in labelled and labelled[c].notna().any()]
    means = labelled.groupby("series", sort=False)[metrics + evaluations + costs].mean()
    means = means.loc[series.series_order(labelled)]
    primary, base = metrics[0], means.index[0]
    relative = (means[primary] / means.loc[base, primary] - 1) * 100
    rows = []
    for name, values in means.iterrows():
        own = labelled[labelled["series"] == name]
        row = {"series": name, "seeds": int(own[SEED].nunique() if SEED in own else len(own))}
        if "lr_grid" in own and own["lr_grid"].notna().any():
            chosen, grid = own["lr_chosen"].iloc[0], own["lr_grid"].iloc[0]
            row["lr (grid)"] = f"{format_value(chosen)} of {grid}"
        for m in metrics + evaluations:
            row[_metric_title(m)] = _format_metric(m, values[m])
        row[f"Δ {QUALITY[primary]} vs {base}"] = "—" if name == base else f"{relative[name]:+.1f} %"
        for c in costs:
            row[COST[c]] = _format_cost(c, values[c])
        rows.append(row)
    note = (
        f"Final evaluation after training, mean over seeds; Δ: relative difference of "
        f"{QUALITY[primary]} from the first row ({base}). `@label`: evaluated with that kernel "
        "instead of the trained one. Step time and peak memory are of one training step at the "
        "trained size (blank when the preset does not measure them)."
    )
    table = (
        pd.DataFrame(rows).rename(columns={"series": "configuration"})
        if own_names
        else _with_keys(rows, labelled, keys)
    )
    return Table("Quality and cost after training", table, note)


def _metric_title(metric: str) -> str:
    name, _, label = metric.partition("@")
    return QUALITY[name] + (f" @{label}" if label else "")


# The trained quality metrics a length sweep reports, the first present being the one shown,
# and the accuracy exact attention must reach for a setup to measure anything.
BY_LENGTH = {EVAL_ACCURACY: "accuracy (%)", EVAL_BITS_PER_BYTE: "eval bits/byte"}
CEILING = 0.9


def quality_by_length(frame: pd.DataFrame) -> Table | None:
    """Trained quality per series (rows) and sequence length (columns), mean over seeds.

    For sweeps that train at several lengths (the long-range recall preset and its curriculum
    stages). Each cell: the mean over seeds, with the min..max when there are several, or one
    seed's Wilson 95 % interval. Accuracy tables also say, per column, the steps the model had
    trained when it was measured; per row, whether the job learned the task
    (`analysis.accuracy`); and, as rows, chance and the key-blind floor measured on the same
    batches. The note says whether exact attention reached the task's ceiling (90 % accuracy) at
    every length: where it did not, the setup measures nothing there and must be retuned.
    """
    metric = next((m for m in BY_LENGTH if not series.trained_quality(frame, m).empty), None)
    if metric is None:
        return None
    trained = series.trained_quality(frame, metric)
    if trained[SEQ_LEN].nunique() < 2:
        return None
    is_accuracy = metric == EVAL_ACCURACY
    if is_accuracy:
        trained = accuracy.with_learned(trained)
    labelled, _ = series.with_series(trained, x=SEQ_LEN)
    stats = series.mean_spread(labelled, SEQ_LEN, metric)
    lengths = sorted(stats[SEQ_LEN].unique())
    scale = 100 if is_accuracy else 1
    titles = {length: f"L={_length(length)}" for length in lengths}
    if is_accuracy:
        steps = accuracy.steps_behind(labelled).groupby(labelled[SEQ_LEN]).max()
        titles = {
            length: title
            + (f" ({steps[length]:,.0f} steps)" if pd.notna(steps.get(length)) else "")
            for length, title in titles.items()
        }
    rows = []
    for name in series.series_order(labelled):
        mine = stats[stats["series"] == name].set_index(SEQ_LEN)
        records = labelled[labelled["series"] == name]
        row = {"variant": name, "seeds": int(mine["n"].max()) if len(mine) else 0}
        for length in lengths:
            cell = _mean_range(mine, length, scale)
            interval = accuracy.interval_text(records[records[SEQ_LEN] == length], scale)
            row[titles[length]] = f"{cell} {interval}" if interval else cell
        if is_accuracy:
            row[LEARNED] = accuracy.learned_cell(records)
        if "lr_chosen" in records:
            row["lr"] = ", ".join(map(format_value, sorted(records["lr_chosen"].dropna().unique())))
        rows.append(row)
    note = f"{BY_LENGTH[metric]} on the evaluation batches after training, mean over seeds "
    note += "(min–max when several; [Wilson 95 % interval over the distinct pairs] for one)."
    if is_accuracy:
        chance, floor = accuracy.chance_and_floor(labelled)
        for label, values in (
            ("chance", {length: chance for length in lengths} if chance is not None else {}),
            ("key-blind floor", floor),
        ):
            if len(values):
                line = {"variant": label, "seeds": ""}
                for length in lengths:
                    value = values.get(length)
                    line[titles[length]] = "—" if value is None else f"{value * 100:.1f}"
                line[LEARNED] = ""
                rows.append(line)
        note += (
            " Column: the optimiser steps trained when measured (one training run through the "
            f"curriculum). learned: an evaluation of any stage reached {accuracy.LEARNED:.0%}; "
            "a variant that did not is not learned, not a cost. Key-blind floor: the most "
            "frequent value in the context, on the same batches. "
            + _ceiling_note(labelled, stats, lengths)
        )
    note += " " + tuning.protocol_line(labelled)
    return Table(
        f"Trained quality vs sequence length: {BY_LENGTH[metric]}",
        pd.DataFrame(rows).fillna(""),  # the chance and floor rows have no lr
        note,
    )


def _mean_range(stats: pd.DataFrame, length, scale: float) -> str:
    if length not in stats.index:
        return "—"
    cell = stats.loc[length]
    text = f"{cell['mean'] * scale:.1f}"
    if cell["n"] > 1:
        text += f" ({cell['lo'] * scale:.1f}–{cell['hi'] * scale:.1f})"
    return text


def _ceiling_note(labelled: pd.DataFrame, stats: pd.DataFrame, lengths) -> str:
    """Whether exact attention reached the ceiling at every length, and where it did not."""
    exact = [s for s in series.series_order(labelled) if s == series.REFERENCE]
    if not exact:
        return "Exact attention was not trained here, so no row can be read against it."
    mine = stats[stats["series"] == exact[0]].set_index(SEQ_LEN)["mean"]
    missing = [_length(L) for L in lengths if L not in mine.index]
    below = [_length(L) for L in lengths if L in mine.index and mine[L] < CEILING]
    if not missing and not below:
        return f"Exact attention reached ≥ {CEILING:.0%} at every length: the setup measures."
    parts = []
    if below:
        parts.append(f"stayed below {CEILING:.0%} at L={', '.join(below)}")
    if missing:
        parts.append(f"was not measured at L={', '.join(missing)}")
    return (
        f"WARNING: exact attention {' and '.join(parts)}; at those lengths this setup measures "
        "nothing (retune it before reading the other rows)."
    )


def _swap_by_knob(group: pd.DataFrame, knob: str, order) -> dict[str, str]:
    """The kernel swap's Δ bits/byte at each knob value in `order`, when measured."""
    swap = SWAP_DELTA_BITS_PER_BYTE
    if swap not in group or group[swap].isna().all():
        return {}
    deltas = group.groupby(knob)[swap].mean().reindex(order)
    return {"swap Δ bits/byte": " → ".join(f"{d:.3g}" for d in deltas)}


# The knob table's verdicts: a step may rise this much (noise) and still count as falling, and
# an error that moves less than KNOB_FLAT from the coarsest setting to the finest is flat.
KNOB_STEP = 0.02
KNOB_FLAT = 0.05


def _knob_verdict(finer: pd.Series) -> str:
    """ "yes", "flat" or "NO" for errors ordered from the coarsest setting to the finest."""
    steps = finer.diff().dropna() / finer.shift().dropna()
    change = finer.iloc[-1] / finer.iloc[0] - 1
    if abs(change) < KNOB_FLAT and (steps.abs() < KNOB_FLAT).all():
        return "flat"
    return "yes" if (steps <= KNOB_STEP).all() and change <= -KNOB_FLAT else "NO"


def error_by_knob(frame: pd.DataFrame) -> Table | None:
    """Whether each variant's error on trained activations falls as its knob gets finer.

    One row per variant and setting of its other knobs whose first knob (`series.KNOBS`) was
    swept: the error at each knob value, at the longest length measured, and whether it falls
    as the knob grows (as it shrinks for `SMALLER_IS_FINER`): `_knob_verdict`.
    """
    rows = []
    for attention, (knob, *others) in series.KNOBS.items():
        if knob not in frame or APPROX_REL_ERROR not in frame:
            continue
        mine = frame[
            (frame[ATTENTION] == attention)
            & (frame[STATUS] == "ok")
            & frame[APPROX_REL_ERROR].notna()
            & frame[knob].notna()
        ]
        if mine.empty:
            continue
        mine = mine[mine[SEQ_LEN] == mine[SEQ_LEN].max()]
        others = [o for o in others if o in mine and mine[o].notna().any()]
        groups = mine.groupby(others, dropna=False) if others else [((), mine)]
        for setting, group in groups:
            errors = group.groupby(knob)[APPROX_REL_ERROR].mean()
            if len(errors) < 2:
                continue
            finer = errors.sort_index(ascending=knob not in series.SMALLER_IS_FINER)
            falls = _knob_verdict(finer)
            setting = setting if isinstance(setting, tuple) else (setting,)
            rows.append(
                {
                    "variant": attention,
                    "other knobs": ", ".join(
                        f"{o.split('.', 1)[1]}={format_value(v)}"
                        for o, v in zip(others, setting, strict=True)
                    )
                    or "—",
                    SEQ_LEN: _length(mine[SEQ_LEN].iloc[0]),
                    "finer →": " → ".join(
                        f"{knob.split('.', 1)[1]}={format_value(k)}: {e:.3g}"
                        for k, e in finer.items()
                    ),
                    "falls": falls,
                    **_swap_by_knob(group, knob, finer.index),
                }
            )
    if not rows:
        return None
    note = (
        "Relative error on trained activations (approx_rel_error) at each knob value, ordered "
        "from the coarsest approximation to the finest; mean over seeds; 'swap': the held-out "
        "bits/byte change when the kernel replaces exact attention in the reference. 'yes': it "
        f"never rises by more than {KNOB_STEP:.0%} a step and ends at least {KNOB_FLAT:.0%} "
        f"lower; 'flat': it moves less than {KNOB_FLAT:.0%} from the coarsest to the finest; "
        "'NO': it does not fall as the approximation gets finer on these inputs "
        "(docs/quality.md, 'Knobs', says why where we measured it)."
    )
    return Table("Approximation error against each variant's knob", pd.DataFrame(rows), note)


def _format_metric(metric: str, value: float) -> str:
    if pd.isna(value):
        return ""
    name = metric.split("@", 1)[0]
    return f"{value * 100:.1f}" if name == EVAL_ACCURACY else f"{value:.4f}"


def _format_cost(column: str, value: float) -> str:
    if pd.isna(value):
        return ""
    if column == PEAK_MEMORY_BYTES:
        return f"{value / MIB:.1f}"
    return f"{value:.0f}" if column == TOKENS_PER_S else f"{value:.1f}"


def provenance(frame: pd.DataFrame) -> list[str]:
    """Markdown bullets: what was measured, where, with what."""
    counts = frame[STATUS].value_counts().to_dict()
    lines = [
        f"- sweeps: {_distinct(frame[SWEEP])}; {len(frame)} records "
        f"({', '.join(f'{n} {s}' for s, n in counts.items())})",
        f"- device: {_distinct(frame[DEVICE_NAME])} ({_distinct(frame[DEVICE])}), "
        f"threads {_distinct(frame[THREADS])}, torch {_distinct(frame[TORCH_VERSION])}",
        f"- git commit: {_distinct(frame[GIT_COMMIT])}; hosts: {_distinct(frame[HOSTNAME])}",
    ]
    stamps = frame[TIMESTAMP].dropna()
    if len(stamps):
        lines.append(f"- measured: {stamps.min()} … {stamps.max()}")
    return lines


def timing_warnings(frame: pd.DataFrame) -> Table | None:
    """Timings not to take at face value: a figure whose blocks spread widely (the record's
    `timing_warning`), and a kernel time that disagrees with the same kernel elsewhere in the
    sweep (same attention, options and shape, another block or depth: the kernel alone is timed,
    so its time cannot depend on them) by more than KERNEL_DISAGREEMENT×."""
    labelled, keys = series.with_series(frame)
    ok = labelled[labelled[STATUS] == "ok"]
    rows = []
    if TIMING_WARNING in ok:
        for _, rec in ok[ok[TIMING_WARNING].notna()].iterrows():
            rows.append({"series": rec["series"], JOB: rec[JOB], "warning": rec[TIMING_WARNING]})
    options = sorted(c for c in ok.columns if c.startswith("attention."))
    inputs = [c for c in (ATTENTION, *options, *KERNEL_INPUTS) if c in ok]
    for metric in scaling_fits.TIME_METRICS.values():
        timed = ok[ok[metric].notna()]
        if timed.empty:
            continue
        same_kernel = timed[inputs].map(format_value).apply(tuple, axis=1)
        for _, group in timed.groupby(same_kernel, sort=False):
            fastest = group.loc[group[metric].idxmin()]
            for _, rec in group.iterrows():
                ratio = rec[metric] / fastest[metric]
                if ratio > KERNEL_DISAGREEMENT:
                    rows.append(
                        {
                            "series": rec["series"],
                            JOB: rec[JOB],
                            "warning": (
                                f"{metric} {rec[metric]:.3g} is {ratio:.0f}× the "
                                f"{fastest[metric]:.3g} of the same kernel in job "
                                f"{fastest[JOB]} ({fastest['series']})"
                            ),
                        }
                    )
    if not rows:
        return None
    note = (
        "Treat these figures with care: re-measure them (delete the record and re-run the sweep) "
        "on a quieter machine."
    )
    return Table("Timing warnings", _with_keys(rows, labelled, keys), note)


def explicit_path(frame: pd.DataFrame) -> Table | None:
    """The series whose kernel ran in explicit matmuls (`kernel_path` explicit): no fused
    attention kernel on that device and dtype, or none at all (linear, performer), while exact
    attention's SDPA runs fused; their times are marked here."""
    if KERNEL_PATH not in frame:
        return None
    labelled, keys = series.with_series(frame)
    explicit = labelled[(labelled[STATUS] == "ok") & (labelled[KERNEL_PATH] == "explicit")]
    if explicit.empty:
        return None
    rows = [
        {
            "series": label,
            "jobs": ", ".join(map(str, group[JOB])),
            DEVICE: _distinct(group[DEVICE]),
        }
        for label, group in explicit.groupby("series", sort=False)
    ]
    note = (
        "These kernels ran on the explicit path (`kernel_path`): their times are not those of a "
        "fused kernel, where exact attention's are."
    )
    return Table("Measured on the explicit path", _with_keys(rows, labelled, keys), note)


def _with_keys(rows: list[dict], labelled: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`rows` (each with its `series` label) with the label replaced by the series' key
    columns (`series.key_values`): variant, then each key that varies."""
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    described = series.key_values(labelled, keys).loc[table["series"]].reset_index(drop=True)
    return pd.concat([described, table.drop(columns="series")], axis=1)


def _informative(table: pd.DataFrame, also_empty: Sequence[str] = ()) -> pd.DataFrame:
    """`table` without the columns whose every cell says nothing (blank, —, n/a, `also_empty`)."""
    empty = (*EMPTY, *also_empty)
    return table[[c for c in table if not table[c].map(lambda v: str(v) in empty).all()]]


def _crossover(f: scaling_fits.SeriesFit, name: str) -> str:
    if f.crossover is not None:
        return str(f.crossover)
    # No crossover: exact attention is the reference itself; any other series had no
    # measurement to compare (e.g. every job skipped).
    return "reference" if name.startswith(series.REFERENCE) else "—"


def _longest_ok(rows: pd.DataFrame) -> str:
    ok = rows.loc[rows[STATUS] == "ok", SEQ_LEN].dropna()
    return _length(ok.max()) if len(ok) else "—"


def _first_failures(rows: pd.DataFrame) -> str:
    """The status at the shortest failed length, e.g. "oom at 8,192"."""
    failed = rows[rows[STATUS] != "ok"].dropna(subset=[SEQ_LEN])
    if failed.empty:
        return ""
    shortest = failed[SEQ_LEN].min()
    statuses = ",".join(dict.fromkeys(failed.loc[failed[SEQ_LEN] == shortest, STATUS]))
    return f"{statuses} at {_length(shortest)}"


def _value_at(stats: pd.DataFrame, name: str, length, scale: float, spec: str = ".1f") -> str:
    if length is None:
        return "—"
    match = stats[(stats["series"] == name) & (stats[SEQ_LEN] == length)]
    return format(match["mean"].iloc[0] / scale, spec) if len(match) else "—"


def _depth_cell(name: str, depth: float, memory, step, failed) -> str:
    def at(stats: pd.DataFrame) -> pd.DataFrame:
        return stats[(stats["series"] == name) & (stats[DEPTH] == depth)]

    mem, time = at(memory), at(step)
    if mem.empty and time.empty:
        return ",".join(at(failed)[STATUS].unique()) or "—"
    mem_text = f"{mem['mean'].iloc[0] / MIB:.1f}" if len(mem) else "—"
    time_text = f"{time['mean'].iloc[0]:.0f}" if len(time) else "—"
    return f"{mem_text} / {time_text}"


def _length(value) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{float(value):,.0f}"


def _distinct(column: pd.Series) -> str:
    values = [format_value(v) for v in column.dropna().unique()]
    return ", ".join(values) if values else "unknown"


def _cell(value) -> str:
    text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")
