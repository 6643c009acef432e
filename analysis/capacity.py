"""Recall capacity (Zoology's MQAR axis): accuracy against the number of key-value pairs.

From the records of a sweep that trains at one length over several `task.n_pairs` (the
`capacity` preset, where one model per variant, head dim and seed trains on a mixture of counts
and is recorded at each): per variant and head dim (d_model / n_heads), the trained accuracy at each
number of pairs, and the variant's *capacity*: the largest n_pairs up to which it stays within
`WITHIN` of exact attention's accuracy at the same head dim (every smaller point too).
Fixed-state kernels (linear, Performer) are expected to fall as the pairs outgrow their state,
and to hold more pairs at a larger head dim; attention and LSH are not. The report's section
(`SECTION`): both tables and the figure of accuracy against pairs.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis import accuracy, coverage, hybrid, series, table_command, tuning
from analysis.column_names import (
    ATTENTION,
    D_MODEL,
    DEPTH,
    EVAL_ACCURACY,
    HEAD_DIM,
    LAYERS,
    N_HEADS,
    SEQ_LEN,
)
from analysis.figures import style
from analysis.load import format_value
from analysis.markdown_table import Table
from analysis.section import FigureSpec, Section, TableSpec
from experiments.records import store

PAIRS = "task.n_pairs"
# The counts a mixture-trained job drew from (experiments/training/tasks/recall.py).
MIXTURE = "task.train_pairs"
WITHIN = 0.10  # capacity: within 10 points of exact attention


def capacity_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Trained-accuracy records of a capacity sweep (several n_pairs at one length), with
    `head_dim` and the learned columns of `analysis.accuracy`; empty if `frame` is not one."""
    trained = series.trained_quality(frame)
    if (
        trained.empty
        or PAIRS not in trained
        or trained[PAIRS].nunique() < 2
        or trained[SEQ_LEN].nunique() != 1
    ):
        return trained.iloc[0:0].assign(**{HEAD_DIM: pd.Series(dtype=int)})  # columns stay readable
    trained = accuracy.with_learned(_shapes_named(_named(trained)))
    # The control is the smallest count a job was evaluated at (every state holds it), not
    # its shortest length: a capacity job has one length.
    smallest = trained.groupby("job_key")[PAIRS].transform("min")
    control = trained[trained[PAIRS] == smallest].groupby("job_key")[EVAL_ACCURACY].mean()
    trained["control_accuracy"] = trained["job_key"].map(control)
    return trained.copy().assign(**{HEAD_DIM: (trained[D_MODEL] // trained[N_HEADS]).astype(int)})


def _named(records: pd.DataFrame) -> pd.DataFrame:
    """Each row under the name it is read by, as its attention and variant: a plain model's
    variant label (its attention and the options that vary among its rows, "sliding_window
    window=64": two windows are two rows), a hybrid stack's `layers` ("gated_deltanet+full":
    its `attention` is its full layers', and a stack is not exact attention's row)."""
    records = records.copy()
    names = records["variant" if "variant" in records else ATTENTION].astype(object)
    stacked = store.is_stack(records)
    names[stacked] = records.loc[stacked, LAYERS].map(str)
    for column in (ATTENTION, "variant"):
        records[column] = names
    return records


# The model's shape beside head dim (its own column): a row at another depth or width than
# most of the sweep's says so in its name.
SHAPE = (DEPTH, D_MODEL)


def _shapes_named(records: pd.DataFrame) -> pd.DataFrame:
    """A model at another depth or width than most of the sweep's under its name and shape
    ("full (depth 4)", "mamba2 (d_model 32)"): the rows are keyed by name and head dim, and two
    shapes must not be averaged."""
    varying = [c for c in SHAPE if c in records and records[c].nunique() > 1]
    if not varying:
        return records
    usual = {c: records[c].mode().iloc[0] for c in varying}
    suffix = records[varying].apply(
        lambda row: shape_text({c: row[c] for c in varying if row[c] != usual[c]}), axis=1
    )
    shaped = suffix != ""
    records = records.copy()
    for column in (ATTENTION, "variant"):
        records[column] = records[column].astype(object)
        records.loc[shaped, column] = (
            records.loc[shaped, column].map(str) + " (" + suffix[shaped] + ")"
        )
    return records


def shape_text(shape: dict) -> str:
    """A model's shape as row names say it: {"depth": 4, "d_model": 32} -> "depth 4, d_model 32"."""
    return ", ".join(f"{column} {format_value(value)}" for column, value in shape.items())


def of_usual_shape(frame: pd.DataFrame) -> pd.DataFrame:
    """The records of the sweep's usual depth and width (each column's most frequent value)."""
    for column in (c for c in SHAPE if c in frame and frame[c].nunique() > 1):
        frame = frame[frame[column] == frame[column].mode().iloc[0]]
    return frame


def _reference(name: str) -> str:
    """The exact-attention row a row is read against: its shape's ("full (depth 4)")."""
    shape = name[name.index(" (") :] if " (" in name else ""
    return series.REFERENCE + shape


def _mixture_note(records: pd.DataFrame) -> str:
    """How the points were trained: one model per job on a mixture of counts, or one per count."""
    mixtures = records.get(MIXTURE, pd.Series(dtype=object)).dropna().map(str).unique()
    if len(mixtures) == 0:
        return "Each point is a model trained at that number of pairs. "
    return (
        "Each variant, head dim and seed is one model, trained on sequences whose number of "
        f"pairs is drawn from {', '.join(mixtures)} and evaluated at each. "
    )


def _means(records: pd.DataFrame) -> pd.DataFrame:
    """Mean, min, max and count of accuracy per (attention, head_dim, n_pairs)."""
    grouped = records.groupby([ATTENTION, HEAD_DIM, PAIRS])[EVAL_ACCURACY]
    return grouped.agg(["mean", "min", "max", "count"]).reset_index()


def _order(records: pd.DataFrame) -> list[str]:
    """Exact attention first, then each efficient layer by name, followed by its other rows
    (other depths, options, the stacks it is the efficient layer of)."""
    names = set(records[ATTENTION].map(str))

    def key(name: str) -> tuple:
        family = hybrid.efficient_layer(name)
        return (name != series.REFERENCE, family, len(hybrid.unit(name)) > 1, name != family, name)

    return sorted(names, key=key)


def accuracy_by_pairs(frame: pd.DataFrame) -> Table | None:
    """Accuracy (%) per variant and head dim (rows) and n_pairs (columns): one seed's Wilson
    95 % interval, or the mean (min–max) over seeds; rows for chance and the key-blind floor."""
    records = capacity_records(frame)
    if records.empty:
        return None
    means = _means(records)
    pairs = sorted(records[PAIRS].unique())
    rows = []
    for head_dim in sorted(records[HEAD_DIM].unique()):
        for name in _order(records):
            mine = records[(records[ATTENTION] == name) & (records[HEAD_DIM] == head_dim)]
            if mine.empty:
                continue
            row = {"variant": name, "head dim": int(head_dim)}
            if "lr_chosen" in records:
                row["lr"] = _lr(mine)
            for p in pairs:
                at = mine[mine[PAIRS] == p]
                row[f"{p} pairs"] = _cell(at)
            row["variant"] += _learned_mark(mine)
            rows.append(row)
    chance, floor = accuracy.chance_and_floor(records, by=PAIRS)
    for label, values in (
        ("chance", {p: chance for p in pairs} if chance is not None else {}),
        ("key-blind floor", floor),
    ):
        if len(values):
            rows.append(
                {
                    "variant": label,
                    "head dim": "",
                    **({"lr": ""} if "lr_chosen" in records else {}),
                    **{f"{p} pairs": _pct(values.get(p)) for p in pairs},
                }
            )
    steps = accuracy.steps_behind(records).max()
    note = (
        f"Trained accuracy (%) at seq_len {format_value(records[SEQ_LEN].iloc[0])} after "
        f"{format_value(steps)} steps; one seed: [Wilson 95 % interval over the distinct pairs "
        "answered]; several: mean (min–max). A variant none of whose points reached "
        f"{accuracy.LEARNED:.0%} is marked not learned. Key-blind floor: the most frequent value "
        "in the context, on the same batches (1 / n_pairs with distinct values). "
        + _mixture_note(records)
        + _exact_note(means)
        + " "
        + tuning.protocol_line(records)
    )
    return Table("Recall capacity: accuracy vs number of pairs", pd.DataFrame(rows), note)


def _learned_mark(jobs: pd.DataFrame) -> str:
    """ " (not learned)", " (1 of 2 seeds learned)" or "" for one variant and head dim."""
    learned = jobs.drop_duplicates("job_key")["job_learned"].astype(bool)
    if not learned.any():
        return " (not learned)"
    if not learned.all():
        return f" ({int(learned.sum())} of {len(learned)} seeds learned)"
    return ""


def _lr(jobs: pd.DataFrame) -> str:
    """The learning rate the rows were trained at (`tuning.lr_text`)."""
    return tuning.lr_text(jobs)


def capacity_cells(frame: pd.DataFrame) -> dict[str, dict[int, str]]:
    """Per efficient variant, per head dim: its capacity as the table and the headline print it
    (`_capacity_cell`); {} if `frame` is not a capacity sweep."""
    return _cells(capacity_records(frame))


def _cells(records: pd.DataFrame) -> dict[str, dict[int, str]]:
    if records.empty:
        return {}
    means = _means(records)
    head_dims = sorted(int(d) for d in records[HEAD_DIM].unique())
    # Exact attention, at any depth, is what the other rows are read against: not a row.
    return {
        name: {d: _capacity_cell(means, records, name, d) for d in head_dims}
        for name in _order(records)
        if name != _reference(name)
    }


def capacity(frame: pd.DataFrame) -> Table | None:
    """Per variant (rows) and head dim (columns): the largest n_pairs up to which its accuracy
    stays within 10 points of exact attention's at the same head dim, depth and n_pairs."""
    records = capacity_records(frame)
    cells = _cells(records)
    if not cells:
        return None
    rows = []
    for name, by_dim in cells.items():
        row = {"variant": name, **{f"head dim {d}": cell for d, cell in by_dim.items()}}
        if "lr_chosen" in records:
            mine = records[records[ATTENTION] == name]
            row["lr per head dim"] = " / ".join(
                _lr(mine[mine[HEAD_DIM] == d]) for d in sorted(by_dim)
            )
        rows.append(row)
    note = (
        "Capacity: the largest number of pairs up to which the variant's accuracy (mean over "
        f"seeds) stays within {WITHIN * 100:.0f} points of exact attention's at the same head dim "
        "(every smaller number too); '< n' when it is already further at the smallest, '≥ n' "
        "when it never is. " + _exact_note(_means(records)) + " " + tuning.protocol_line(records)
    ) + coverage.note(records, [ATTENTION, HEAD_DIM], frame)
    return Table("Recall capacity per head dim", pd.DataFrame(rows), note)


def _capacity_cell(means, records, name, head_dim) -> str:
    mine = means[(means[ATTENTION] == name) & (means[HEAD_DIM] == head_dim)]
    reference = _reference(name) if _reference(name) in set(means[ATTENTION]) else series.REFERENCE
    exact = means[(means[ATTENTION] == reference) & (means[HEAD_DIM] == head_dim)]
    if mine.empty or exact.empty:
        return "—"
    jobs = records[(records[ATTENTION] == name) & (records[HEAD_DIM] == head_dim)]
    if not jobs["job_learned"].any():
        return accuracy.not_learned_text(jobs)
    exact_at = exact.set_index(PAIRS)["mean"]
    best = None
    for _, row in mine.sort_values(PAIRS).iterrows():
        p = row[PAIRS]
        if p not in exact_at.index or row["mean"] < exact_at[p] - WITHIN:
            break
        best = p
    pairs = sorted(mine[PAIRS])
    if best is None:
        return f"< {format_value(pairs[0])}"
    if best == pairs[-1]:
        return f"≥ {format_value(best)}"
    return format_value(best)


def _exact_note(means: pd.DataFrame) -> str:
    exact = means[means[ATTENTION] == series.REFERENCE]
    if exact.empty:
        return "WARNING: exact attention was not trained here: no capacity can be read."
    low = exact[exact["mean"] < 0.95]
    if low.empty:
        return "Exact attention reached ≥ 95 % at every point: the setup measures."
    points = ", ".join(
        f"{format_value(r[PAIRS])} pairs at head dim {format_value(r[HEAD_DIM])} ({r['mean']:.1%})"
        for _, r in low.iterrows()
    )
    return f"WARNING: exact attention stayed below 95 % at {points}; retune before reading."


def _cell(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "—"
    values = rows[EVAL_ACCURACY]
    interval = accuracy.interval_text(rows)
    if interval:
        return f"{values.iloc[0] * 100:.1f} {interval}"
    if len(values) > 1:
        return f"{values.mean() * 100:.1f} ({values.min() * 100:.1f}–{values.max() * 100:.1f})"
    return f"{values.iloc[0] * 100:.1f}"


def _pct(value) -> str:
    return "—" if value is None or pd.isna(value) else f"{value * 100:.1f}"


def accuracy_vs_pairs(frame: pd.DataFrame) -> Figure:
    """Trained accuracy against n_pairs (log 2), one panel per head dim, a line per variant
    (mean over seeds, band min–max); dashed: chance, dash-dotted: the key-blind floor."""
    records = capacity_records(frame)
    head_dims = sorted(records[HEAD_DIM].unique())
    fig, axes = style.new_figure(max(1, len(head_dims)), "Recall capacity: accuracy vs pairs")
    if records.empty:
        style.message(axes[0], "no trained accuracy over several n_pairs at one length")
        return style.finish(fig)
    means = _means(records)
    # Each row of a family (other shapes, options, its stacks) its own shade of the family's
    # colour, in table order, dotted: a family's rows are told apart, not drawn alike.
    families: dict[str, list[str]] = {}
    for name in _order(records):
        families.setdefault(hybrid.efficient_layer(name), []).append(name)
    for ax, head_dim in zip(axes, head_dims, strict=False):
        for name in _order(records):
            mine = means[(means[ATTENTION] == name) & (means[HEAD_DIM] == head_dim)]
            if mine.empty:
                continue
            jobs = records[(records[ATTENTION] == name) & (records[HEAD_DIM] == head_dim)]
            label = name
            if not jobs["job_learned"].any():
                label += f" ({accuracy.not_learned_text(jobs)})"
            family = hybrid.efficient_layer(name)
            stacked = family != name
            color = style.shade(style.variant_color(family), families[family].index(name))
            ax.plot(
                mine[PAIRS],
                mine["mean"] * 100,
                marker="s" if stacked else "o",
                markersize=4,
                linestyle=":" if stacked else "-",
                color=color,
                label=label,
            )
            if (mine["count"] > 1).any():
                ax.fill_between(
                    mine[PAIRS], mine["min"] * 100, mine["max"] * 100, color=color, alpha=0.2
                )
        _lines(ax, records[records[HEAD_DIM] == head_dim])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(records[PAIRS].unique()))
        ax.get_xaxis().set_major_formatter(style.plain_number)
        ax.set_xlabel("key-value pairs")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(f"head dim {int(head_dim)}", fontsize=9)
        style.legend_below(ax, ncol=1 if len(ax.get_legend_handles_labels()[0]) < 8 else 2)
    return style.finish(fig)


def _lines(ax: Axes, records: pd.DataFrame) -> None:
    chance, floor = accuracy.chance_and_floor(records, by=PAIRS)
    if chance is not None:
        ax.axhline(chance * 100, color="grey", linestyle="--", linewidth=1)
    if len(floor):
        ax.plot(
            floor.index,
            floor.values * 100,
            color="grey",
            linestyle="-.",
            linewidth=1,
            label="key-blind floor",
        )


SECTION = Section(
    "Recall capacity",
    tables=(TableSpec(capacity), TableSpec(accuracy_by_pairs)),
    figures={
        "accuracy_vs_pairs": FigureSpec(
            accuracy_vs_pairs,
            "Recall capacity: trained accuracy against the number of key-value pairs per head "
            "dim (mean, band min–max over seeds); dashed: chance, dash-dotted: the key-blind "
            "floor.",
            when=lambda frame: (
                None
                if not capacity_records(frame).empty
                else "no trained accuracy over several n_pairs at one length (the capacity preset)"
            ),
        ),
    },
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.capacity SWEEP_DIR...`: the capacity tables (capacity per head dim,
    accuracy by pairs), as Markdown."""
    table_command.print_tables(
        "python -m analysis.capacity",
        main.__doc__,
        [capacity, accuracy_by_pairs],
        "no capacity records (trained accuracy over several n_pairs at one length)",
        argv,
    )


if __name__ == "__main__":
    main()
