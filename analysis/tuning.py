"""Learning rates chosen from a grid, on held-out data, as Zoology reports MQAR.

A quality sweep runs every variant at several `train.lr` (and may sweep `train.weight_decay`:
its points are then (learning rate, weight decay) pairs, chosen together). Per *family*
(everything a job is but its learning rate, weight decay, seed and the columns its records
differ in among themselves), each grid point's score is the mean `valid_accuracy` over all its
records, a job that did not end ok scoring 0; the best *usable* point is kept (a tie: the
smaller), and its records gain `lr_grid`, `lr_chosen`, `lr_any_learned` (and `wd_chosen`). The
choice is made on the validation split, never on the numbers reported. A family with no usable
point has none chosen (`lr_chosen` empty; `null` in a tuned table); a family with one point, or
records with no validation, are left as they are.

Families, scores and usable points in full: docs/internals-analysis.md, "tuning".
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.context import LR, TUNED, WD, context_columns
from analysis.load import format_value, load_results
from experiments.records.files import write_atomic

VALID = "valid_accuracy"
VALID_LOSS = "valid_loss"  # a task without accuracy: chosen on its held-out loss
ACCURACY = "eval_accuracy"
LEARNED = 0.9
# The columns a job's records differ in among themselves: not part of a family.
PER_RECORD = ("seq_len", "batch_size", "task.n_pairs", *TUNED)


def family_columns(frame: pd.DataFrame, context: list[str]) -> list[str]:
    """The columns that make a family: the variant, its options and the `context` columns
    (`analysis.context.context_columns`), less the grid's axes and what differs between one
    job's records."""
    options = sorted(c for c in frame.columns if c.startswith("attention."))
    context = [c for c in context if c not in PER_RECORD]
    return [c for c in ("attention", *options, *context) if c in frame]


def grid_text(rates) -> str:
    """ "{0.001, 0.003, 0.01}": a grid of learning rates as tables print it."""
    return "{" + ", ".join(format_value(r) for r in sorted(rates)) + "}"


def grid_axes(frame: pd.DataFrame) -> list[str]:
    """The grid axes (`TUNED`) that take more than one value in `frame`."""
    return [c for c in TUNED if c in frame and frame[c].dropna().nunique() > 1]


def grid_label(family: pd.DataFrame, axes: list[str]) -> str:
    """The grid as tables print it: "{0.001, 0.003, 0.01}", with " × wd {0, 0.1}" when the
    weight decay is an axis."""
    text = grid_text(family[LR].dropna().unique()) if LR in family else "{}"
    if WD in axes:
        text += " × wd " + grid_text(family[WD].dropna().unique())
    return text


def choose_learning_rates(frame: pd.DataFrame, context: list[str]) -> pd.DataFrame:
    """`frame` with, per family of more than one grid point (`train.lr`, and `train.weight_decay`
    when it is swept too), only the chosen point's records (the module doc), each with
    `lr_grid`, `lr_chosen`, `lr_any_learned` (and `wd_chosen`); a family that ran one point
    where others ran another (a preset at tuned rates, conf/tuned/) keeps its records with that
    rate as `lr_chosen` and no `lr_grid`. `context`: the frame's context columns
    (`analysis.context.context_columns`)."""
    if LR not in frame or not grid_axes(frame) or not _validated(frame):
        return frame
    columns = family_columns(frame, context)
    keys = frame[columns].apply(lambda row: "|".join(map(format_value, row)), axis=1)
    axes = [c for c in TUNED if c in frame]
    kept = []
    for _, family in frame.groupby(keys, sort=False):
        points = sorted(set(family[axes].dropna().itertuples(index=False, name=None)))
        if len(points) == 1:
            kept.append(family.assign(lr_chosen=points[0][0]))
            continue
        if not points:
            kept.append(family)
            continue
        score = rate_scores(family, axes)
        usable = usable_points(family, axes)
        best = min(usable or points, key=lambda p: (-score.get(_index(p), 0.0), p))
        # A job that did not end ok learned nothing, whatever it recorded before it failed.
        learned = family[ACCURACY].fillna(0) >= LEARNED
        if "learned" in family:
            learned |= family["learned"].map(lambda v: v is True or v == 1)
        if "status" in family:
            learned &= family["status"] == "ok"
        at_best = (family[axes] == pd.Series(best, index=axes)).all(axis=1)
        swept = grid_axes(family)  # the weight decay is named only where this family swept it
        kept.append(
            family[at_best].assign(
                lr_grid=grid_label(family, swept),
                lr_any_learned=bool(learned.any()),
                **(_chosen(swept, axes, best) if usable else {"lr_chosen": np.nan}),
            )
        )
    return pd.concat(kept) if kept else frame


def usable_points(family: pd.DataFrame, axes: list[str] | tuple[str, ...] = (LR,)) -> list:
    """The grid points (tuples over `axes`) of one family a choice can fall on: those with a
    record that ended ok and validated to a number (accuracy, or a byte task's loss)."""
    ok = family["status"] == "ok" if "status" in family else pd.Series(True, index=family.index)
    column = VALID if VALID in family and family[VALID].notna().any() else VALID_LOSS
    if column not in family:
        return []
    values = pd.to_numeric(family[column], errors="coerce").astype(float)
    usable = family.loc[ok & np.isfinite(values), list(axes)].dropna()
    return sorted(set(usable.itertuples(index=False, name=None)))


def _chosen(swept: list[str], axes: list[str], point: tuple) -> dict[str, float]:
    """The chosen point's columns: `lr_chosen`, and `wd_chosen` where the family swept the
    weight decay."""
    values = dict(zip(axes, point, strict=True))
    chosen = {"lr_chosen": values[LR]}
    if WD in swept:
        chosen["wd_chosen"] = values[WD]
    return chosen


def _index(point: tuple):
    """A grid point as `rate_scores` indexes it: the value alone on one axis, else the tuple."""
    return point[0] if len(point) == 1 else point


def _validated(frame: pd.DataFrame) -> bool:
    """Whether `frame` has held-out validation to choose on: accuracy, or a byte task's loss."""
    return any(c in frame and frame[c].notna().any() for c in (VALID, VALID_LOSS))


def rate_scores(family: pd.DataFrame, axes: list[str] | tuple[str, ...] = (LR,)) -> pd.Series:
    """Each grid point's score in one family (indexed by the learning rate, or by (lr, weight
    decay) tuples when both are `axes`): the mean `valid_accuracy` of its records (a job not
    ended ok scores 0), over the seeds that ran every point of the grid (the tuning seeds), so
    that seeds added later at the chosen point alone cannot move the choice. A task without
    accuracy (bits per byte) scores minus its mean `valid_loss` (a job not ended ok: -inf)."""
    axes = list(axes)
    points = set(family[axes].dropna().itertuples(index=False, name=None))
    if "seed" in family:
        seeds = [
            s
            for s, runs in family.groupby("seed")
            if set(runs[axes].dropna().itertuples(index=False, name=None)) >= points
        ]
        family = family[family["seed"].isin(seeds)] if seeds else family
    ok = family["status"] == "ok" if "status" in family else True
    if not usable_points(family, axes):  # nothing validated: no point scores above another
        return pd.Series(0.0, index=[_index(p) for p in points])
    by = [family[c] for c in axes] if len(axes) > 1 else family[axes[0]]
    if VALID not in family or family[VALID].isna().all():
        loss = family[VALID_LOSS].where(ok).fillna(np.inf)
        return -loss.groupby(by).mean()
    return family[VALID].where(ok).fillna(0.0).groupby(by).mean()


def chosen_rates(frame: pd.DataFrame, context: list[str]) -> pd.DataFrame:
    """One row per family of `frame` that ran a grid: its columns (`family_columns`), `lr_grid`,
    `lr_chosen`, `lr_any_learned`, the chosen rate's mean validation accuracy (or loss) and its
    `overrides`: `attention=` with its options and `train.lr=` the chosen rate, the Hydra
    overrides that run the variant at that rate in the same preset, for more seeds or head
    dims (the preset sets the rest; a family's context columns are in the row)."""
    chosen = choose_learning_rates(frame, context)
    if "lr_chosen" not in chosen:
        return pd.DataFrame()
    columns = family_columns(frame, context)
    rows = []
    grid = chosen["lr_grid"] if "lr_grid" in chosen else pd.Series(None, index=chosen.index)
    decided = chosen[chosen["lr_chosen"].notna() | grid.notna()]  # chosen, or none usable
    for _, family in decided.groupby(columns, sort=False, dropna=False):
        first = family.iloc[0]
        keys = [c for c in columns if c.startswith("attention.") and c != "attention.name"]
        overrides = [f"attention={first['attention']}"]
        overrides += [f"{c}={override_value(first[c])}" for c in keys if _given(first[c])]
        if _given(first["lr_chosen"]):  # none: no usable point (`usable_points`)
            overrides.append(f"{LR}={format_value(first['lr_chosen'])}")
            if "wd_chosen" in family and pd.notna(first["wd_chosen"]):
                overrides.append(f"{WD}={format_value(first['wd_chosen'])}")
        rows.append(
            {
                "variant": first.get("variant", first["attention"]),
                **{c: first[c] for c in columns},
                "lr_grid": first.get("lr_grid"),
                "lr_chosen": first["lr_chosen"],
                **({"wd_chosen": first["wd_chosen"]} if "wd_chosen" in family else {}),
                "lr_any_learned": first["lr_any_learned"],
                **{c: family[c].mean() for c in (VALID, VALID_LOSS) if c in family},
                "overrides": " ".join(overrides),
            }
        )
    return pd.DataFrame(rows)


def lr_text(records: pd.DataFrame) -> str:
    """The learning rate(s) `records` trained at, as a table shows it: the grid's choice (", wd
    0.1" where it chose a weight decay too) or the one rate, "none usable" for a grid with no
    usable rate, and " (untuned)" when a preset's tuned table had no rate for them
    (`lr_source`, experiments/app/resolvers.py)."""
    chosen = records["lr_chosen"] if "lr_chosen" in records else pd.Series(dtype=float)
    rates = chosen.dropna().unique()
    if not len(rates):
        if "lr_grid" in records and records["lr_grid"].notna().any():
            return "none usable"
        rates = records[LR].dropna().unique() if LR in records else []
    text = ", ".join(format_value(r) for r in sorted(rates)) or "—"
    if "wd_chosen" in records and records["wd_chosen"].notna().any():  # a (lr, wd) grid
        decays = sorted(records["wd_chosen"].dropna().unique())
        text += ", wd " + ", ".join(map(format_value, decays))
    return text + (" (untuned)" if _untuned(records).any() else "")


def _untuned(records: pd.DataFrame) -> pd.Series:
    if "lr_source" not in records:
        return pd.Series(False, index=records.index)
    return records["lr_source"] == "untuned"


def override_value(value) -> str:
    """A record's option value as one Hydra override token (no spaces): lists as [a,b]."""
    if isinstance(value, str) and value.startswith("["):
        value = json.loads(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    return format_value(value)


def _given(value) -> bool:
    return not (value is None or (isinstance(value, float) and np.isnan(value)))


def protocol_line(records: pd.DataFrame) -> str:
    """One line saying how a quality table's rows were trained: the grid and its choice, the
    cap, the early stop, the seeds."""
    parts = []
    if "lr_grid" in records and records["lr_grid"].notna().any():
        grids = ", ".join(records["lr_grid"].dropna().unique())
        swept = "lr and weight decay" if "wd_chosen" in records else "lr"
        parts.append(f"{swept} per variant from {grids}, chosen on the validation split")
    elif LR in records and records[LR].notna().any():
        rates = ", ".join(format_value(r) for r in sorted(records[LR].dropna().unique()))
        per_variant = "lr_chosen" in records and records[LR].nunique() > 1
        parts.append(f"lr per variant, fixed (one each: {rates})" if per_variant else f"lr {rates}")
    names = records.get("attention", pd.Series(None, index=records.index, dtype=object))
    untuned = sorted(names[_untuned(records)].dropna().unique())
    if untuned:  # the preset's tuned table had no usable rate for them
        parts.append(f"untuned (no tuned rate): {', '.join(untuned)}")
    if "train.steps" in records and records["train.steps"].notna().any():
        parts.append(_caps(records))
    stop = records.get("train.stop_accuracy", pd.Series(dtype=float)).dropna()
    patience = records.get("train.patience", pd.Series(dtype=float)).dropna()
    if len(stop):
        parts.append(f"stop at {format_value(stop.iloc[0] * 100)} % on validation")
    if len(patience):
        parts.append(f"or after {format_value(patience.iloc[0])} evaluations without gain")
    if not len(stop) and not len(patience):
        parts.append("no early stop")
    if "seed" in records:
        parts.append(f"{records['seed'].nunique()} seed(s), each shown in its range")
    return "Protocol: " + "; ".join(parts) + "."


def _caps(records: pd.DataFrame) -> str:
    """The step caps as the protocol line says them: one per curriculum stage, the last stage's
    `train.steps` ("caps 1000 + 150 steps, a stage each"), or the one cap of a run without
    stages."""
    finals = sorted(records["train.steps"].dropna().unique())
    stages = records.get("train.curriculum", pd.Series(dtype=object)).dropna()
    stages = {v if isinstance(v, str) else json.dumps(list(v)) for v in stages}  # text or list
    if len(stages) == 1 and len(finals) == 1:
        caps = [stage["steps"] for stage in json.loads(stages.pop())] + [finals[0]]
        if len(caps) > 1:
            text = " + ".join(format_value(c) for c in caps)
            return f"caps {text} steps ({format_value(sum(caps))} in all, a stage each)"
    return f"cap {'/'.join(format_value(s) for s in finals)} steps (the final stage's)"


def rate_table(
    rates: pd.DataFrame, records: pd.DataFrame, source: str, merged_into: str | None = None
) -> str:
    """`rates` (`chosen_rates`) as the YAML a preset reads with `${tuned_lr:TABLE,...}`
    (experiments/app/resolvers.py): one `attention: rate` line per variant, under a header that
    says where the rates come from (the sweep, its commits and dates, the grid, what no rate
    learned). A variant tuned twice (two families, e.g. two option sets) at two different rates
    is an error: the table keys by attention name only. A variant with no usable rate
    (`usable_points`: every job diverged, or none validated to a number) is written `null`, with
    a comment line saying why: `${tuned_lr:...}` trains it untuned.

    `merged_into`: the text of an existing table (`--merge`): its lines are kept but the entries
    of the variants `rates` tunes, and these rates follow as a block of their own, under a
    header naming this sweep (`merged_table`). A family that ran one rate (no `lr_grid`: a
    variant run at a fixed rate beside the grid) chose nothing and is not written.

    `ValueError` if no family ran a grid."""
    rates = rates[rates["lr_grid"].notna()] if "lr_grid" in rates else rates.iloc[0:0]
    if rates.empty:
        raise ValueError("no variant here ran a learning-rate grid: nothing was chosen")
    if "wd_chosen" in rates:
        raise ValueError(
            "a tuned table holds learning rates only, and this grid also chose weight decays "
            "(give them with train.weight_decay=, from --overrides)"
        )
    by_name: dict[str, float] = {}
    for _, row in rates[rates["lr_chosen"].notna()].iterrows():
        name, rate = row["attention"], float(row["lr_chosen"])
        if by_name.get(name, rate) != rate:
            raise ValueError(
                f"{name!r} has two families with different chosen rates ({by_name[name]} and "
                f"{rate}): a tuned table keys by attention name; tune one family per sweep"
            )
        by_name[name] = rate
    unusable = sorted(set(rates.loc[rates["lr_chosen"].isna(), "attention"]) - set(by_name))
    names = sorted([*by_name, *unusable])
    if "attention" in records:  # provenance of the grid's records, not of the others
        records = records[records["attention"].isin(names)]
    commits = sorted({str(c)[:7] for c in records.get("git_commit", pd.Series()).dropna()})
    stamps = records.get("timestamp", pd.Series(dtype=str)).dropna().sort_values()
    dates = f"{stamps.iloc[0][:10]} … {stamps.iloc[-1][:10]}" if len(stamps) else "unknown"
    usable = rates[rates["lr_chosen"].notna()]
    unlearned = sorted(usable.loc[~usable["lr_any_learned"].astype(bool), "attention"].unique())
    if merged_into is None:
        lines = [
            "# Learning rates chosen on the validation split of a grid (analysis/tuning.py),",
            f"# written by `python -m analysis.tuning {source} --write <this file>`.",
        ]
    else:
        lines = [
            f"# {', '.join(names)}: merged by",
            f"# `python -m analysis.tuning {source} --write <this file> --merge`",
            "# (the entries above are other grids', kept).",
        ]
    lines += [
        f"# Grid: {', '.join(sorted(rates['lr_grid'].dropna().unique()))}; records: commit "
        f"{', '.join(commits) or 'unknown'}, {dates}.",
        f"# Learned at no rate of the grid: {', '.join(unlearned) or 'none'}",
        "# (their rate is the grid's best all the same: the tables say 'not learned').",
    ]
    if unusable:
        lines += [f"# No usable rate: {name} ({_why_unusable(records, name)})" for name in unusable]
        lines.append("# (null: `${tuned_lr:...}` trains it at its default rate, lr_source untuned)")
    lines += [
        f"{name}: {'null' if name in unusable else format_value(by_name[name])}" for name in names
    ]
    block = "\n".join(lines) + "\n"
    return block if merged_into is None else merged_table(merged_into, names, block)


def merged_table(existing: str, names: list[str], block: str) -> str:
    """`existing` (a tuned table's text) without the entries (`name: rate` lines) of `names`,
    nor an earlier merged block (a paragraph headed "# a, b: merged by") of those names only,
    then `block` (their new entries under their header) after one blank line."""
    kept = []
    for paragraph in existing.strip("\n").split("\n\n"):
        header = _MERGED.match(paragraph)
        if header and set(header.group(1).split(", ")) <= set(names):
            continue  # superseded whole
        lines = [
            line
            for line in paragraph.splitlines()
            if not any(line.startswith(f"{name}:") for name in names)
        ]
        if any(line.strip() for line in lines):
            kept.append("\n".join(lines))
    return "\n\n".join([*kept, block.rstrip("\n")]) + "\n"


_MERGED = re.compile(r"^# ([\w, ]+): merged by\n# `python -m analysis\.tuning")


def _why_unusable(records: pd.DataFrame, name: str) -> str:
    """ "every job ended diverged (3)", or how many ended ok without a validation figure."""
    mine = records[records["attention"] == name]
    jobs = mine.drop_duplicates("job") if "job" in mine else mine
    statuses = jobs["status"] if "status" in jobs else pd.Series("ok", index=jobs.index)
    counts = ", ".join(f"{n} {s}" for s, n in statuses.value_counts().items())
    return f"its jobs ended {counts}; none ended ok with a validation figure"


def main(argv: list[str] | None = None) -> int:
    """`python -m analysis.tuning SWEEP_DIR... [--overrides | --write FILE [--merge]]`: the
    learning rate chosen per family; or (--overrides) one line of Hydra overrides per family, to
    run more seeds or head dims at the chosen rate (`make capacity-seeds`); or (--write) the
    rates as the table a preset reads (`conf/tuned/<preset>.yaml`, `${tuned_lr:...}`), with
    --merge into the table FILE already holds (its other variants kept: a grid of a few new
    variants). A mistake (no results, nothing to tune, a file that cannot be written) is one
    `error:` line, exit 1."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.tuning", description=main.__doc__)
    parser.add_argument("paths", nargs="+", help="sweep dirs or results files")
    parser.add_argument("--overrides", action="store_true", help="print Hydra overrides only")
    parser.add_argument("--write", metavar="FILE", help="write the rates as a tuned table")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --write: keep FILE's other variants, replace (or add) these",
    )
    args = parser.parse_args(argv)
    if args.merge and not args.write:
        return _error("--merge: only with --write FILE")
    try:
        frame = load_results(args.paths)
    except (FileNotFoundError, ValueError) as error:  # no results there, not a results file
        return _error(" ".join(str(error).split()))
    rates = chosen_rates(frame, context_columns(frame)) if len(frame) else pd.DataFrame()
    if rates.empty:
        return _error(
            f"no family with a learning-rate grid and validation in {', '.join(args.paths)}"
        )
    if args.overrides:  # a family with no usable rate has no rate to run more seeds at
        for _, row in rates.iterrows():
            if _given(row["lr_chosen"]):
                print(row["overrides"])
            else:
                print(f"# no usable rate: {row['overrides']}", file=sys.stderr)
        return 0
    if args.write:
        target = Path(args.write)
        if not target.parent.is_dir():
            return _error(f"--write {target}: no such folder {target.parent}")
        existing = None
        if args.merge and target.is_file():
            try:
                existing = target.read_text()
            except (OSError, UnicodeDecodeError) as error:
                return _error(f"--write {target} --merge: {getattr(error, 'strerror', error)}")
        try:
            text = rate_table(rates, frame, " ".join(args.paths), merged_into=existing)
        except ValueError as error:  # two rates for one variant
            return _error(f"--write {target}: {error}")
        try:
            write_atomic(target, lambda tmp: tmp.write_text(text))
        except OSError as error:
            return _error(f"--write {target}: {error.strerror or error}")
        written = rates["lr_grid"].notna().sum() if "lr_grid" in rates else 0
        print(f"wrote {args.write}: {written} rates" + (" merged" if args.merge else ""))
        return 0
    context = [c for c in context_columns(rates) if c in rates and rates[c].nunique() > 1]
    shown = ["variant", *context, "lr_grid", "lr_chosen", "wd_chosen", "lr_any_learned"]
    shown += [VALID, VALID_LOSS]
    print(rates[[c for c in shown if c in rates]].to_string(index=False))
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
