"""What an accuracy is read against: whether its job learned the task, chance and the floor.

- A job *learned* when an evaluation of any of its stages reached `LEARNED` (90 %) accuracy,
  its control stage (the shortest length, where every pattern sees every key) included. A job
  that did not is "not learned in N steps (control x %)", a result and never an accuracy cost.
  The job's own record carries `learned` for the whole run (stage records: so far), so a job is
  learned when any of its records says so or reached 90 % (older records: the latter only).
- *Chance* is a uniform guess among the values; the *floor* is the key-blind predictor's
  accuracy measured on the same eval batches (experiments/training/tasks/recall.py): a model at the
  floor has not used the key.

Tables, figures and the headline all read these functions, so they agree.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.load import format_value

LEARNED = 0.9
ACCURACY = "eval_accuracy"


def job_key(frame: pd.DataFrame) -> pd.Series:
    """Which job each record belongs to: its sweep and the job (its dir's name) before a
    stage's `/L`; records without a job (hand-made frames): the same configuration but its
    length."""
    sweep = frame["sweep"].map(str) if "sweep" in frame else pd.Series("", index=frame.index)
    if "job" in frame and frame["job"].notna().all():
        return sweep + "#" + frame["job"].map(lambda j: str(j).split("/", 1)[0])
    parts = [c for c in ("attention", "seed", "task.n_pairs", "n_heads", "d_model") if c in frame]
    return sweep + "#" + frame[parts].apply(lambda row: "/".join(map(str, row)), axis=1)


def with_learned(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (records with `eval_accuracy`) plus, per record, its `job_key`, its job's
    `job_learned`,
    `job_steps` (steps the job trained in all), `job_steps_to_learn` and `control_accuracy`
    (its accuracy at the job's shortest length)."""
    out = frame.copy()
    out["job_key"] = job_key(out)
    reached = out[ACCURACY] >= LEARNED
    if "learned" in out:
        reached |= out["learned"].map(lambda v: v is True or v == 1)
    out["_reached"] = reached
    steps = steps_behind(out)
    out["_steps"] = steps
    grouped = out.groupby("job_key")
    out["job_learned"] = grouped["_reached"].transform("any")
    out["job_steps"] = grouped["_steps"].transform("max")
    if "steps_to_learn" in out:
        out["job_steps_to_learn"] = grouped["steps_to_learn"].transform("min")
    else:
        out["job_steps_to_learn"] = math.nan
    shortest = grouped["seq_len"].transform("min")
    control = out[out["seq_len"] == shortest].groupby("job_key")[ACCURACY].mean()
    out["control_accuracy"] = out["job_key"].map(control)
    return out.drop(columns=["_reached", "_steps"])


def steps_behind(frame: pd.DataFrame) -> pd.Series:
    """Optimiser steps behind each record: `trained_steps` (curriculum), else `train.steps`."""
    steps = pd.Series(math.nan, index=frame.index)
    if "trained_steps" in frame:
        steps = pd.to_numeric(frame["trained_steps"], errors="coerce")
    if "train.steps" in frame:
        steps = steps.fillna(pd.to_numeric(frame["train.steps"], errors="coerce"))
    return steps


def not_learned_text(rows: pd.DataFrame) -> str:
    """ "not learned in 550 steps (control 6.2 %)" for a variant's not-learned records (the
    most steps any of them trained, the best control accuracy); of a learning-rate grid
    (`analysis.tuning`), "... at any lr of {…}" when no rate of it learned."""
    steps = rows["job_steps"].max()
    text = "not learned"
    if pd.notna(steps):
        text += f" in {format_value(steps)} steps"
    if "lr_grid" in rows and rows["lr_grid"].notna().any():  # a learning-rate grid
        if not rows["lr_any_learned"].fillna(False).astype(bool).any():
            text += f" at any lr of {rows['lr_grid'].dropna().iloc[0]}"
        elif rows["lr_chosen"].notna().any():
            text += f" at lr {format_value(rows['lr_chosen'].dropna().iloc[0])}"
            if "wd_chosen" in rows and rows["wd_chosen"].notna().any():
                text += f", wd {format_value(rows['wd_chosen'].dropna().iloc[0])}"
        else:  # no rate of the grid ended ok with a validation figure (`tuning.usable_points`)
            text += f" (no usable lr of {rows['lr_grid'].dropna().iloc[0]})"
    control = rows["control_accuracy"].max()
    if pd.notna(control):
        text += f" (control {control:.1%})"
    return text


def learned_cell(rows: pd.DataFrame) -> str:
    """A variant's learned column: "yes, step 350" (the earliest first evaluation at 90 % over
    seeds), "not learned in N steps (control x %)", or "k of n seeds" when they differ."""
    jobs = rows.drop_duplicates("job_key") if "job_key" in rows else rows
    learned = jobs["job_learned"].astype(bool)
    if learned.all():
        first = jobs["job_steps_to_learn"]
        return f"yes, step {format_value(first.min())}" if first.notna().any() else "yes"
    if not learned.any():
        return not_learned_text(jobs)
    return f"{int(learned.sum())} of {len(jobs)} seeds"


def chance_and_floor(frame: pd.DataFrame, by: str = "seq_len") -> tuple[float | None, pd.Series]:
    """Chance (a fraction; None when no record knows it) and the measured key-blind floor per
    value of `by` (mean over the records; empty when none measured it)."""
    chance = None
    if "chance_accuracy" in frame and frame["chance_accuracy"].notna().any():
        chance = float(frame["chance_accuracy"].dropna().iloc[0])
    elif "task.n_values" in frame and frame["task.n_values"].notna().any():
        chance = 1 / float(frame["task.n_values"].dropna().iloc[0])
    if "floor_accuracy" not in frame or frame["floor_accuracy"].isna().all():
        return chance, pd.Series(dtype=float)
    return chance, frame.groupby(by)["floor_accuracy"].mean()


def interval_text(rows: pd.DataFrame, scale: float = 100) -> str | None:
    """ "[95.1–98.0]": the Wilson 95 % interval of a single record's accuracy, else None."""
    if len(rows) != 1 or "eval_accuracy_ci_low" not in rows:
        return None
    low, high = rows["eval_accuracy_ci_low"].iloc[0], rows["eval_accuracy_ci_high"].iloc[0]
    if pd.isna(low) or pd.isna(high):
        return None
    return f"[{low * scale:.1f}–{high * scale:.1f}]"
