"""The trained-quality section of report.md (`SECTION`): final quality and cost per trained
configuration (`quality`), trained quality against sequence length (`quality_by_length`, read
against chance, the key-blind floor and exact attention's ceiling) as a table and a figure
(`accuracy_vs_seq_len`), and the trained-with × evaluated-with table (`cross_evaluation`). What
an accuracy is read against: `analysis.accuracy`. Alone: `python -m analysis.trained_quality
PATH...` prints the tables (docs/swap.md's).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis import accuracy, coverage, section, series, table_command, tuning
from analysis.column_names import (
    ATTENTION,
    EVAL_ACCURACY,
    EVAL_BITS_PER_BYTE,
    EVAL_LOSS,
    LEARNED,
    PEAK_MEMORY_BYTES,
    SEED,
    SEQ_LEN,
    STATUS,
    STEP_MS,
    TASK,
    TOKENS_PER_S,
)
from analysis.figures import style
from analysis.markdown_table import Table, format_length, with_keys
from analysis.section import FigureSpec, Section, TableSpec
from experiments.records.record import MIB
from experiments.records.store import task_metrics

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
    left_out = (*series.NO_QUALITY_TASKS, *series.SUITE_TASKS)  # the suites have their tables
    trained = frame[(frame[STATUS] == "ok") & ~frame[TASK].isin(left_out)]
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
            row["lr (grid)"] = f"{tuning.lr_text(own)} of {own['lr_grid'].dropna().iloc[0]}"
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
        else with_keys(rows, labelled, keys)
    )
    return Table("Quality and cost after training", table, note)


def _metric_title(metric: str) -> str:
    name, _, label = metric.partition("@")
    return QUALITY[name] + (f" @{label}" if label else "")


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
    titles = {length: f"L={format_length(length)}" for length in lengths}
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
            row["lr"] = tuning.lr_text(records)
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
            + coverage.note(labelled, ["series"], frame)
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
    missing = [format_length(L) for L in lengths if L not in mine.index]
    below = [format_length(L) for L in lengths if L in mine.index and mine[L] < CEILING]
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


def accuracy_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Trained accuracy against seq_len per series: mean over seeds with a min..max band.

    Only records of tasks with a quality signal (never random tokens). Dotted: the 90 % that
    exact attention must reach for the setup to measure anything; dashed: chance; dash-dotted:
    the key-blind floor measured on the same batches. A series whose job never reached 90 % is
    labelled "not learned in N steps (control x %)" in the legend (`analysis.accuracy`).
    """
    trained = series.trained_quality(frame).assign(accuracy_pct=lambda f: f[EVAL_ACCURACY] * 100)
    trained = accuracy.with_learned(trained)
    labelled, _ = series.with_series(trained, x=SEQ_LEN)
    fig, (ax,) = style.new_figure(
        1, "Trained accuracy vs sequence length (mean, min–max over seeds)"
    )
    xs = style.draw_series(ax, labelled, SEQ_LEN, "accuracy_pct", notes=_learned_notes(labelled))
    ax.axhline(90, color="grey", linestyle=":", linewidth=1)
    _chance_and_floor(ax, labelled, SEQ_LEN)
    style.label_axes(ax, "", SEQ_LEN, "accuracy (%)", log=(True, False), xs=xs)
    ax.set_ylim(-2, 102)
    return style.finish(fig)


def _learned_notes(labelled: pd.DataFrame) -> dict[str, str]:
    """series -> "(not learned in N steps (control x %))" for series none of whose jobs learned."""
    notes = {}
    for name, rows in labelled.groupby("series"):
        if not rows["job_learned"].any():
            notes[str(name)] = f"({accuracy.not_learned_text(rows)})"
    return notes


def _chance_and_floor(ax: Axes, labelled: pd.DataFrame, x: str) -> None:
    """Chance (dashed) and the measured key-blind floor per `x` (dash-dotted), in percent."""
    chance, floor = accuracy.chance_and_floor(labelled, by=x)
    if chance is not None:
        ax.axhline(chance * 100, color="grey", linestyle="--", linewidth=1)
        ax.annotate("chance", (0.01, chance * 100), xycoords=("axes fraction", "data"), fontsize=7)
    if len(floor):
        ax.plot(floor.index, floor.values * 100, color="grey", linestyle="-.", linewidth=1)
        ax.annotate(
            "key-blind floor",
            (floor.index[-1], floor.values[-1] * 100),
            fontsize=7,
            xytext=(2, 3),
            textcoords="offset points",
        )


SECTION = Section(
    "Trained quality",
    tables=(
        TableSpec(cross_evaluation),
        TableSpec(quality, section.QUALITY),
        TableSpec(quality_by_length, section.QUALITY),
    ),
    figures={
        "accuracy_vs_seq_len": FigureSpec(
            accuracy_vs_seq_len,
            "Trained accuracy against sequence length per variant: mean over seeds, band "
            "min–max; dotted: the 90 % exact attention must reach for the setup to measure "
            "anything; dashed: chance; dash-dotted: the key-blind floor measured on the same "
            "batches; a variant that never reached 90 % is labelled not learned in the legend.",
            when=lambda frame: (
                None
                if series.trained_quality(frame)[SEQ_LEN].nunique() > 1
                else "no trained accuracy at two lengths or more (random-token loss is not quality)"
            ),
            reads=section.QUALITY,
        ),
    },
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.trained_quality SWEEP_DIR...`: quality and cost after training, by
    length, and trained-with × evaluated-with, as Markdown (those the records fill)."""
    table_command.print_tables(
        "python -m analysis.trained_quality",
        main.__doc__,
        [quality, quality_by_length, cross_evaluation],
        "no trained quality in these records",
        argv,
    )


if __name__ == "__main__":
    main()
