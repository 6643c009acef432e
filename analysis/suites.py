"""The field's quality suites beside their published numbers: MAD's six tasks (`mad_table`) and
Long Range Arena's ListOps (`listops_table`), read only from the records.

- MAD (Poli et al. 2024, arXiv 2403.17844): per variant, the accuracy on each of the six tasks
  (task `mad`, one `task.kind` each; experiments/training/tasks/mad.py) and their average, each
  at the grid point its validation chose (`series.trained_quality`: per variant and task, as
  MAD takes the best of its lr x weight-decay grid per task setting); a score whose job never
  reached 90 % on validation is marked † (not learned, the suite's rule); rows for chance and the
  measured floor; and the published rows (the DeltaNet paper's Fig. 3, which runs MAD's
  protocol: Transformer and DeltaNet), in the paper's column order.
- ListOps (Tay et al. 2020, arXiv 2011.04006, Table 1): per variant our accuracy on the reduced
  ListOps (task `listops`) beside the LRA column of the model it corresponds to, with chance and
  the floor (the most frequent answer); LRA's models without a counterpart here are listed too.

    python -m analysis.suites multirun/mad multirun/listops
"""

from __future__ import annotations

import pandas as pd

from analysis import accuracy, series, table_command, tuning
from analysis.column_names import ATTENTION, EVAL_ACCURACY, SEQ_LEN, TASK
from analysis.load import format_value
from analysis.markdown_table import Table
from variants import registry

KIND = "task.kind"
# The paper's column order (DeltaNet paper Fig. 3) and each column's task kind.
MAD_COLUMNS = {
    "Compress": "compression",
    "Fuzzy": "fuzzy_recall",
    "In-context": "in_context_recall",
    "Memorize": "memorization",
    "Noisy": "noisy_recall",
    "Selective copy": "selective_copying",
}
MAD_SOURCE = (
    "Yang et al. 2024 (DeltaNet, arXiv 2406.06484) Fig. 3, MAD's protocol (Poli et al. 2024)"
)
# Published MAD scores (%), per column of MAD_COLUMNS, then the average.
MAD_PUBLISHED = {
    "Transformer": (51.6, 29.8, 94.1, 85.2, 86.8, 99.6, 74.5),
    "DeltaNet": (42.2, 35.7, 100.0, 52.8, 100.0, 100.0, 71.8),
}

LRA_SOURCE = "Tay et al. 2020 (Long Range Arena, arXiv 2011.04006) Table 1, ListOps"
# LRA Table 1's ListOps column (%), in its order.
LRA_LISTOPS = {
    "Transformer": 36.37,
    "Local Attention": 15.82,
    "Sparse Transformer": 17.07,
    "Longformer": 35.63,
    "Linformer": 35.70,
    "Reformer": 37.27,
    "Sinkhorn Transformer": 33.67,
    "Synthesizer": 36.99,
    "BigBird": 36.05,
    "Linear Transformer": 16.13,
    "Performer": 18.01,
}


def published_as(attention: str, suite: str) -> str | None:
    """The published model `attention` is in `suite`'s table (`Attention.published_as`: the
    same method; sizes and lengths differ), None for a variant it has no row for or one not
    registered here."""
    try:
        return registry.attention_spec(attention).published_as.get(suite)
    except ValueError:
        return None


def _pct(value) -> str:
    return "—" if value is None or pd.isna(value) else f"{value * 100:.1f}"


def _names(records: pd.DataFrame) -> pd.Series:
    """A row label per record: the variant, "(bidirectional)" for one trained so beside causal
    ones."""
    names = records["variant"].map(str)
    if "causal" in records and records["causal"].nunique(dropna=True) > 1:
        names = names.where(records["causal"].fillna(True).astype(bool), names + " (bidirectional)")
    return names


def _order(names: pd.Series) -> list[str]:
    """Row labels, exact attention's first, then in the records' order."""
    seen = list(dict.fromkeys(names))
    return sorted(seen, key=lambda n: (n.split(" ")[0] != series.REFERENCE, seen.index(n)))


def mad_records(frame: pd.DataFrame) -> pd.DataFrame:
    """The MAD records at each variant's chosen grid point per task, with the learned columns
    (`analysis.accuracy`) and a `row` label; empty when `frame` holds none."""
    if TASK not in frame or KIND not in frame:
        return frame.iloc[0:0]
    mad = frame[frame[TASK] == "mad"]
    trained = series.trained_quality(mad, suites=True)
    if trained.empty:
        return trained
    trained = accuracy.with_learned(trained).copy()  # one block: the snapshot's wide frame
    return trained.assign(row=_names(trained))


def mad_scores(records: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy per row label (index) and MAD column; NaN where a task was not trained."""
    means = records.groupby(["row", KIND])[EVAL_ACCURACY].mean().unstack(KIND)
    return means.reindex(columns=list(MAD_COLUMNS.values())).set_axis(list(MAD_COLUMNS), axis=1)


def mad_average(scores: pd.Series):
    """MAD's average over the six tasks; NaN unless all six were trained."""
    return scores.mean() if scores.notna().all() else float("nan")


def mad_table(frame: pd.DataFrame) -> Table | None:
    """Per variant the six MAD scores (%) and their average, † where the job did not learn;
    chance and floor rows; the published rows. None without MAD records."""
    records = mad_records(frame)
    if records.empty:
        return None
    scores = mad_scores(records)
    learned = records.groupby(["row", KIND])["job_learned"].any().unstack(KIND)
    seeds = records.groupby("row")["seed"].nunique() if "seed" in records else None
    rows = []
    for name in _order(records["row"]):
        row = {"variant": name}
        for title, kind in MAD_COLUMNS.items():
            value = scores.loc[name, title]
            mark = "" if pd.isna(value) or bool(learned.loc[name].get(kind, False)) else " †"
            row[title] = _pct(value) + mark
        row["avg"] = _pct(mad_average(scores.loc[name]))
        if seeds is not None:
            row["seeds"] = int(seeds[name])
        rows.append(row)
    by_kind = records.groupby(KIND)
    for label, column in (("chance", "chance_accuracy"), ("floor", "floor_accuracy")):
        if column in records and records[column].notna().any():
            values = by_kind[column].mean()
            cells = {t: _pct(values.get(k)) for t, k in MAD_COLUMNS.items()}
            known = [values[k] for k in MAD_COLUMNS.values() if k in values]
            average = sum(known) / 6 if len(known) == 6 else None
            rows.append({"variant": label, **cells, "avg": _pct(average)})
    for model, published in MAD_PUBLISHED.items():
        cells = dict(zip([*MAD_COLUMNS, "avg"], (f"{v:.1f}" for v in published), strict=True))
        rows.append({"variant": f"{model} (published)", **cells})
    note = (
        "Accuracy (%) on each MAD task's scored positions after training, mean over seeds, each "
        "variant at the grid point its validation chose per task (as MAD takes the best of its "
        "grid per task setting); avg: the mean of the six. † not learned: no evaluation of the "
        "job reached 90 % (for fuzzy recall and compression MAD's own Transformer scores 30–52 "
        "%, so † there reads as partial, against the floor). Floor: the best guess blind to "
        "what is asked (the most frequent answer token the position sees), on the same batches. "
        f"Published rows: {MAD_SOURCE}, averaged over each task's difficulty settings at width "
        f"128 and 200 epochs; ours: {_mad_settings(records)}. " + tuning.protocol_line(records)
    )
    title = "MAD: six synthetic tasks beside the published scores"
    return Table(title, pd.DataFrame(rows, dtype=object).fillna(""), note)


def _mad_settings(records: pd.DataFrame) -> str:
    """One setting per task as the records say it: length, vocabulary and cap."""
    parts = []
    for title, kind in MAD_COLUMNS.items():
        mine = records[records[KIND] == kind]
        if mine.empty:
            continue
        text = f"{title} L={format_value(mine[SEQ_LEN].iloc[0])}"
        vocab = mine.get("task.vocab_size", pd.Series(dtype=float)).dropna()
        if len(vocab):
            text += f" V={format_value(vocab.iloc[0])}"
        if "train.steps" in mine and mine["train.steps"].notna().any():
            text += f" cap {format_value(mine['train.steps'].max())}"
        parts.append(text)
    return "one reduced setting per task (" + "; ".join(parts) + ")"


def listops_records(frame: pd.DataFrame) -> pd.DataFrame:
    """The ListOps records at each variant's chosen rate, with a `row` label; empty if none."""
    if TASK not in frame:
        return frame.iloc[0:0]
    trained = series.trained_quality(frame[frame[TASK] == "listops"])
    if trained.empty:
        return trained
    trained = accuracy.with_learned(trained).copy()  # one block: the snapshot's wide frame
    return trained.assign(row=_names(trained))


def listops_table(frame: pd.DataFrame) -> Table | None:
    """Our ListOps accuracy per variant beside LRA Table 1's ListOps column; chance and floor
    rows; LRA's models without a counterpart here. None without ListOps records."""
    records = listops_records(frame)
    if records.empty:
        return None
    stats = records.groupby("row")[EVAL_ACCURACY].agg(["mean", "min", "max", "count"])
    rows, matched = [], set()
    for name in _order(records["row"]):
        mine = records[records["row"] == name]
        cell = f"{stats.loc[name, 'mean'] * 100:.1f}"
        if stats.loc[name, "count"] > 1:
            cell += f" ({stats.loc[name, 'min'] * 100:.1f}–{stats.loc[name, 'max'] * 100:.1f})"
        else:
            cell += " " + (accuracy.interval_text(mine) or "")
        model = published_as(str(mine[ATTENTION].iloc[0]), "lra")
        matched.add(model)
        rows.append(
            {
                "variant": name,
                "seeds": int(mine["seed"].nunique()) if "seed" in mine else len(mine),
                "ListOps accuracy (%)": cell.strip(),
                "lr": tuning.lr_text(mine),
                "LRA model": model or "—",
                "LRA ListOps (%)": f"{LRA_LISTOPS[model]:.2f}" if model else "—",
            }
        )
    for label, column in (("chance", "chance_accuracy"), ("floor", "floor_accuracy")):
        if column in records and records[column].notna().any():
            rows.append({"variant": label, "ListOps accuracy (%)": _pct(records[column].mean())})
    for model, value in LRA_LISTOPS.items():
        if model not in matched:
            rows.append({"variant": "—", "LRA model": model, "LRA ListOps (%)": f"{value:.2f}"})
    lengths = ", ".join(map(format_value, sorted(records[SEQ_LEN].unique())))
    note = (
        f"Accuracy (%) on the answer of reduced ListOps ({lengths} tokens; LRA: up to 2,000, "
        "4 layers of width 512) after training, mean (min–max) over seeds or one seed's "
        "[Wilson 95 % interval]; each variant at the rate its validation chose. ListOps is "
        "learned in part (LRA's best is 37 %): a row that never reached 90 % is not marked; "
        "read it against the floor (the training split's most frequent answer, on the same "
        "batches) and exact attention. LRA column: "
        f"{LRA_SOURCE}, the model each variant corresponds to (the method, not its size: read "
        "the ordering, not the level). " + tuning.protocol_line(records)
    )
    table = pd.DataFrame(rows, dtype=object).fillna("")
    return Table("ListOps beside Long Range Arena", table, note)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.suites SWEEP_DIR...`: the MAD and ListOps tables, as Markdown."""
    table_command.print_tables(
        "python -m analysis.suites",
        main.__doc__,
        [mad_table, listops_table],
        "no MAD or ListOps records here",
        argv,
    )


if __name__ == "__main__":
    main()
