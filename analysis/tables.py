"""report.md's tables: each builder takes the results frame and returns a `Table`, or None when
the results hold nothing for it (so a report shows only the tables its sweep can fill)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis import scaling, series
from analysis.load import format_value

MIB = 2**20
TAIL = 3  # lengths of the asymptotic exponent


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


def variant_summary(frame: pd.DataFrame) -> Table | None:
    """Per series: exponents, crossover against exact attention, reach, memory and error."""
    labelled, keys = series.with_series(frame, x="seq_len")
    if labelled.empty:
        return None
    fits = {
        name: scaling.scaling_fits(labelled, keys, metric, tail=TAIL)
        for name, metric in scaling.TIME_METRICS.items()
    }
    memory_at = scaling.longest_common_length(labelled, "peak_memory_bytes")
    error_at = scaling.longest_common_length(labelled, "approx_rel_error")
    memory = series.mean_spread(labelled, "seq_len", "peak_memory_bytes")
    error = series.mean_spread(labelled, "seq_len", "approx_rel_error")
    rows = []
    for name in series.series_order(labelled):
        mine = labelled[labelled["series"] == name]
        fwd, fwd_bwd = fits["fwd"][name], fits["fwd+bwd"][name]
        rows.append(
            {
                "variant": name,
                "α fwd": str(fwd.power_law),
                "α fwd+bwd": str(fwd_bwd.power_law),
                f"α fwd+bwd, longest {TAIL} L": str(fwd_bwd.tail_power_law),
                "L* fwd": _crossover(fwd, name),
                "L* fwd+bwd": _crossover(fwd_bwd, name),
                "longest L ok": _longest_ok(mine),
                "failed at": _first_failures(mine),
                f"peak memory @ L={_length(memory_at)} (MiB)": _value_at(
                    memory, name, memory_at, MIB
                ),
                f"rel. error @ L={_length(error_at)}": _value_at(error, name, error_at, 1, ".3g"),
            }
        )
    note = (
        "α: least-squares slope of log(kernel time) against log(seq_len), over the mean per "
        f"length (all lengths, and the {TAIL} longest: the asymptotic regime). L*: the length "
        "above which the variant's kernel is faster than exact attention (SDPA, same context), "
        "the log time ratio interpolated linearly in log L between measured lengths; "
        "≤x: faster at every measured length; >x: still slower at the longest; "
        "(exact oom): exact attention failed there. Memory and error at the longest length "
        "every measured series reached."
    )
    return Table("Per variant", pd.DataFrame(rows), note)


def depth_table(frame: pd.DataFrame) -> Table | None:
    """Peak memory and step time per block type and depth, when depth was swept."""
    labelled, _ = series.with_series(frame, x="depth")
    ok = labelled[(labelled["status"] == "ok") & labelled["depth"].notna()]
    if ok["depth"].nunique() < 2:
        return None
    memory = series.mean_spread(labelled, "depth", "peak_memory_bytes")
    step = series.mean_spread(labelled, "depth", "step_ms")
    failed = series.failures(labelled, "depth")
    depths = sorted(labelled["depth"].dropna().unique())
    rows = []
    for name in series.series_order(labelled):
        row = {"series": name}
        for d in depths:
            row[f"depth {format_value(d)}"] = _depth_cell(name, d, memory, step, failed)
        rows.append(row)
    note = "Each cell: peak memory of one training step (MiB) / its time (ms), mean over seeds."
    return Table("Memory and time vs depth", pd.DataFrame(rows), note)


def failures(frame: pd.DataFrame) -> Table | None:
    """Every configuration that did not end ok, grouped by variant, status and reason."""
    labelled, _ = series.with_series(frame, x="seq_len")
    failed = labelled[labelled["status"] != "ok"]
    if failed.empty:
        return None
    rows = []
    for (name, status, reason), group in failed.groupby(
        ["series", "status", failed["error"].map(lambda e: "" if e is None else str(e))],
        sort=False,
    ):
        rows.append(
            {
                "variant": name,
                "status": status,
                "seq_len": ", ".join(
                    _length(v) for v in sorted(group["seq_len"].dropna().unique())
                ),
                "records": len(group),
                "reason": reason[:160] + ("…" if len(reason) > 160 else ""),
            }
        )
    return Table("Not measured (oom, timeout, skipped, error, diverged)", pd.DataFrame(rows))


def cross_evaluation(frame: pd.DataFrame) -> Table | None:
    """Rows: the kernel a model was trained with; columns: the kernel it was evaluated with.

    Reformer Table 2's layout, from records carrying `eval_accuracy@<label>` columns (the
    runner's `eval.attention` evaluations). The row label is the preset's `train_as` when
    present, else the attention name. Values are accuracy in percent, mean over seeds.
    """
    labels = [c.split("@", 1)[1] for c in frame.columns if c.startswith("eval_accuracy@")]
    ok = frame[frame["status"] == "ok"]
    if not labels or ok.empty:
        return None
    if "train_as" in ok:
        rows = ok["train_as"]
    else:  # records from before `train_as` was recorded: the kernel and its rounds
        rounds = ok.get("attention.n_hashes", pd.Series(index=ok.index, dtype=float))
        rows = ok["attention"] + rounds.map(lambda n: "" if pd.isna(n) else f"-{int(n)}")
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
    "eval_bits_per_byte": "eval bits/byte",
    "eval_accuracy": "eval accuracy (%)",
    "eval_loss": "eval loss",
}
COST = {
    "step_ms": "step (ms)",
    "peak_memory_bytes": "peak memory (MiB)",
    "tokens_per_s": "train tokens/s",
}


def quality(frame: pd.DataFrame) -> Table | None:
    """Final quality and cost per trained configuration, relative to the first (exact) one.

    The table of the quality reproductions (shared vs separate QK, reversible vs residual, Linformer
    k and LSH rounds): one row per series (`series.with_series`: the variant plus whichever of
    block, shared_qk, task, ... vary), mean over seeds, and the relative difference of the first
    quality metric from the first row's. Records of tasks without a quality signal (random_lm)
    and of jobs that did not train are left out.
    """
    trained = frame[(frame["status"] == "ok") & ~frame["task"].isin(series.NO_QUALITY_TASKS)]
    metrics = [m for m in QUALITY if m in trained and trained[m].notna().any()]
    if trained.empty or not metrics:
        return None
    trained = trained[trained[metrics[0]].notna()]
    if trained["seq_len"].nunique() > 1:
        return None  # one row per length and series: `quality_by_length`
    labelled, _ = series.with_series(trained)
    if "train_as" in labelled and labelled["train_as"].notna().all():
        labelled["series"] = labelled["train_as"]  # the preset's own row names
    costs = [c for c in COST if c in labelled and labelled[c].notna().any()]
    means = labelled.groupby("series", sort=False)[metrics + costs].mean()
    means = means.loc[series.series_order(labelled)]
    primary, base = metrics[0], means.index[0]
    relative = (means[primary] / means.loc[base, primary] - 1) * 100
    rows = []
    for name, values in means.iterrows():
        row = {"configuration": name, "seeds": int((labelled["series"] == name).sum())}
        for m in metrics:
            row[QUALITY[m]] = _format_metric(m, values[m])
        row[f"Δ {QUALITY[primary]} vs {base}"] = "—" if name == base else f"{relative[name]:+.1f} %"
        for c in costs:
            row[COST[c]] = _format_cost(c, values[c])
        rows.append(row)
    note = (
        f"Final evaluation after training, mean over seeds; Δ: relative difference of "
        f"{QUALITY[primary]} from the first row ({base}). Step time and peak memory are of one "
        "training step at the trained size (blank when the preset does not measure them)."
    )
    return Table("Quality and cost after training", pd.DataFrame(rows), note)


# The trained quality metrics a length sweep reports, the first present being the one shown,
# and the accuracy exact attention must reach for a setup to measure anything.
BY_LENGTH = {"eval_accuracy": "accuracy (%)", "eval_bits_per_byte": "eval bits/byte"}
CEILING = 0.9


def quality_by_length(frame: pd.DataFrame) -> Table | None:
    """Trained quality per series (rows) and sequence length (columns), mean over seeds.

    For sweeps that train at several lengths (the long-range recall preset and its curriculum
    stages). Each cell: the mean over seeds, with the min..max when there are several. The note
    says whether exact attention reached the task's ceiling (90 % accuracy) at every length:
    where it did not, the setup measures nothing there and must be retuned, not read.
    """
    metric = next((m for m in BY_LENGTH if not series.trained_quality(frame, m).empty), None)
    if metric is None:
        return None
    trained = series.trained_quality(frame, metric)
    if trained["seq_len"].nunique() < 2:
        return None
    labelled, _ = series.with_series(trained, x="seq_len")
    stats = series.mean_spread(labelled, "seq_len", metric)
    lengths = sorted(stats["seq_len"].unique())
    scale = 100 if metric == "eval_accuracy" else 1
    rows = []
    for name in series.series_order(labelled):
        mine = stats[stats["series"] == name].set_index("seq_len")
        row = {"variant": name, "seeds": int(mine["n"].max()) if len(mine) else 0}
        for length in lengths:
            row[f"L={_length(length)}"] = _mean_range(mine, length, scale)
        rows.append(row)
    note = f"{BY_LENGTH[metric]} on the evaluation batches after training, mean over seeds "
    note += "(min–max when several)."
    if metric == "eval_accuracy":
        note += " " + _ceiling_note(labelled, stats, lengths)
        if "task.n_values" in trained and trained["task.n_values"].notna().any():
            chance = 100 / float(trained["task.n_values"].dropna().iloc[0])
            note += f" Chance: {chance:.1f} %."
    return Table(
        f"Trained quality vs sequence length: {BY_LENGTH[metric]}", pd.DataFrame(rows), note
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
    mine = stats[stats["series"] == exact[0]].set_index("seq_len")["mean"]
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


def error_by_knob(frame: pd.DataFrame) -> Table | None:
    """Whether each variant's error on trained activations falls as its knob gets finer.

    One row per variant and setting of its other knobs whose first knob (`series.KNOBS`) was
    swept: the error at each knob value, at the longest length measured, and whether it falls
    (never rises by more than 2 %) as the knob grows (as it shrinks for `SMALLER_IS_FINER`).
    """
    rows = []
    for attention, (knob, *others) in series.KNOBS.items():
        if knob not in frame or "approx_rel_error" not in frame:
            continue
        mine = frame[
            (frame["attention"] == attention)
            & (frame["status"] == "ok")
            & frame["approx_rel_error"].notna()
            & frame[knob].notna()
        ]
        if mine.empty:
            continue
        mine = mine[mine["seq_len"] == mine["seq_len"].max()]
        others = [o for o in others if o in mine and mine[o].notna().any()]
        groups = mine.groupby(others, dropna=False) if others else [((), mine)]
        for setting, group in groups:
            errors = group.groupby(knob)["approx_rel_error"].mean()
            if len(errors) < 2:
                continue
            finer = errors.sort_index(ascending=knob not in series.SMALLER_IS_FINER)
            falls = bool((finer.diff().dropna() <= 0.02 * finer.shift().dropna()).all())
            setting = setting if isinstance(setting, tuple) else (setting,)
            rows.append(
                {
                    "variant": attention,
                    "other knobs": ", ".join(
                        f"{o.split('.', 1)[1]}={format_value(v)}"
                        for o, v in zip(others, setting, strict=True)
                    )
                    or "—",
                    "seq_len": _length(mine["seq_len"].iloc[0]),
                    "finer →": " → ".join(
                        f"{knob.split('.', 1)[1]}={format_value(k)}: {e:.3g}"
                        for k, e in finer.items()
                    ),
                    "falls": "yes" if falls else "NO",
                }
            )
    if not rows:
        return None
    note = (
        "Relative error on trained activations (approx_rel_error) at each knob value, ordered "
        "from the coarsest approximation to the finest; mean over seeds. 'NO': the error does "
        "not fall as the approximation gets finer on these inputs (README, 'Approximation "
        "error', says why where we measured it)."
    )
    return Table("Approximation error against each variant's knob", pd.DataFrame(rows), note)


def _format_metric(metric: str, value: float) -> str:
    if pd.isna(value):
        return ""
    return f"{value * 100:.1f}" if metric == "eval_accuracy" else f"{value:.4f}"


def _format_cost(column: str, value: float) -> str:
    if pd.isna(value):
        return ""
    if column == "peak_memory_bytes":
        return f"{value / MIB:.1f}"
    return f"{value:.0f}" if column == "tokens_per_s" else f"{value:.1f}"


def provenance(frame: pd.DataFrame) -> list[str]:
    """Markdown bullets: what was measured, where, with what."""
    counts = frame["status"].value_counts().to_dict()
    lines = [
        f"- sweeps: {_distinct(frame['sweep'])}; {len(frame)} records "
        f"({', '.join(f'{n} {s}' for s, n in counts.items())})",
        f"- device: {_distinct(frame['device_name'])} ({_distinct(frame['device'])}), "
        f"threads {_distinct(frame['threads'])}, torch {_distinct(frame['torch_version'])}",
        f"- git commit: {_distinct(frame['git_commit'])}; hosts: {_distinct(frame['hostname'])}",
    ]
    stamps = frame["timestamp"].dropna()
    if len(stamps):
        lines.append(f"- measured: {stamps.min()} … {stamps.max()}")
    return lines


def _crossover(f: scaling.SeriesFit, name: str) -> str:
    if f.crossover is not None:
        return str(f.crossover)
    # No crossover: exact attention is the reference itself; any other series had no
    # measurement to compare (e.g. every job skipped).
    return "reference" if name.startswith(series.REFERENCE) else "—"


def _longest_ok(rows: pd.DataFrame) -> str:
    ok = rows.loc[rows["status"] == "ok", "seq_len"].dropna()
    return _length(ok.max()) if len(ok) else "—"


def _first_failures(rows: pd.DataFrame) -> str:
    """The status at the shortest failed length, e.g. "oom at 8,192"."""
    failed = rows[rows["status"] != "ok"].dropna(subset=["seq_len"])
    if failed.empty:
        return ""
    shortest = failed["seq_len"].min()
    statuses = ",".join(dict.fromkeys(failed.loc[failed["seq_len"] == shortest, "status"]))
    return f"{statuses} at {_length(shortest)}"


def _value_at(stats: pd.DataFrame, name: str, length, scale: float, spec: str = ".1f") -> str:
    if length is None:
        return "—"
    match = stats[(stats["series"] == name) & (stats["seq_len"] == length)]
    return format(match["mean"].iloc[0] / scale, spec) if len(match) else "—"


def _depth_cell(name: str, depth: float, memory, step, failed) -> str:
    def at(stats: pd.DataFrame) -> pd.DataFrame:
        return stats[(stats["series"] == name) & (stats["depth"] == depth)]

    mem, time = at(memory), at(step)
    if mem.empty and time.empty:
        return ",".join(at(failed)["status"].unique()) or "—"
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
