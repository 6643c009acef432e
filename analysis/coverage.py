"""Not learned, against a covering pattern: each "not learned" row of the capacity and
long-range tables beside the same variant run with a pattern that covers the sequence, on the
same protocol (`+experiment=coverage_probes`, one probe per file in its folder). A covered run
that learned says what did not (the options the probe changed: a property of the method under
this protocol); one that did not learn leaves the cause open. One sentence per not-learned row
for the tables' notes (`note`). The probes' records: the frame's `coverage_probes` sweep, else
the snapshot docs/results/coverage_probes.csv.

The command: `python -m analysis.not_learned` (analysis/not_learned.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis import accuracy
from analysis.column_names import ATTENTION, D_MODEL, EVAL_ACCURACY, N_HEADS, SEQ_LEN
from analysis.load import format_value, load_results
from analysis.markdown_table import Table

SWEEP = "coverage_probes"
SNAPSHOT = Path(__file__).resolve().parent.parent / "docs" / "results" / f"{SWEEP}.csv"
# What makes a probe's protocol the row's: the task, the stages and the cap (the rate, the head
# dim and the seed are the probe's own and said in its sentence).
PROTOCOL = ("task.name", "train.curriculum", "train.steps")
PAIRS = "task.n_pairs"


@functools.lru_cache(maxsize=4)
def _snapshot(path: Path) -> pd.DataFrame:
    return load_results([path]) if path.exists() else pd.DataFrame()


def probe_records(frame: pd.DataFrame | None = None, snapshot: Path = SNAPSHOT) -> pd.DataFrame:
    """The probes' records: `frame`'s of the coverage_probes sweep, else the committed snapshot
    (empty when neither has any)."""
    if frame is not None and "sweep" in frame and (frame["sweep"] == SWEEP).any():
        return frame[frame["sweep"] == SWEEP]
    return _snapshot(snapshot)


def _rows_only(records: pd.DataFrame) -> pd.DataFrame:
    """`records` but the probes' own."""
    return records[records["sweep"] != SWEEP] if "sweep" in records else records


def _trained(records: pd.DataFrame) -> pd.DataFrame:
    ok = records[(records["status"] == "ok") & records[EVAL_ACCURACY].notna()]
    return accuracy.with_learned(ok) if len(ok) else ok.assign(job_key=pd.Series(dtype=str))


def _head_dim(rows: pd.DataFrame) -> int | None:
    if D_MODEL in rows and N_HEADS in rows and rows[D_MODEL].notna().any():
        return int(rows[D_MODEL].dropna().iloc[0] // rows[N_HEADS].dropna().iloc[0])
    return None


def _protocol(rows: pd.DataFrame) -> tuple[str, ...]:
    return tuple(str(rows[c].iloc[0]) if c in rows else "" for c in PROTOCOL)


def _options(rows: pd.DataFrame) -> dict[str, object]:
    """The attention options `rows` ran with: their `attention.*` columns, a missing one (a
    record older than the option) at the variant's default."""
    import variants  # the registry (torch): only for the defaults

    name = str(rows[ATTENTION].iloc[0])
    try:
        options = dict(variants.attention_spec(name).options)
    except ValueError:  # a plugin not loaded here: only what the records say
        options = {}
    for column in rows.columns:
        if column.startswith("attention.") and column != "attention.name":
            values = rows[column].dropna()
            if len(values):
                options[column.split(".", 1)[1]] = values.iloc[0]
    return options


def _value(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "default"
    return format_value(value) if isinstance(value, (int, float)) else str(value)


def _set_options(name: str, options: dict[str, object]) -> dict[str, object]:
    """`options` that differ from the variant's defaults."""
    import variants

    try:
        defaults = variants.attention_spec(name).options
    except ValueError:
        return options
    return {k: v for k, v in options.items() if _value(v) != _value(defaults.get(k))}


def result_text(job: pd.DataFrame) -> str:
    """What one job measured: its control (the shortest length, or the fewest pairs) and, for
    a capacity job, its most pairs; learned by which step, or not in how many."""
    if PAIRS in job and job[PAIRS].nunique() > 1:
        by = job.groupby(PAIRS)[EVAL_ACCURACY].mean().sort_index()
        ends = by.iloc[[0, -1]]
        where = " / ".join(f"{a * 100:.1f}" for a in ends) + " % at "
        where += " / ".join(format_value(p) for p in ends.index) + " pairs"
    else:
        shortest = job[job[SEQ_LEN] == job[SEQ_LEN].min()]
        where = f"{shortest[EVAL_ACCURACY].mean() * 100:.1f} % at "
        where += f"{format_value(shortest[SEQ_LEN].iloc[0])} tokens"
    if job["job_learned"].any():
        step = job["job_steps_to_learn"].min()
        return ("learned" + (f" by step {format_value(step)}" if pd.notna(step) else "")) + (
            f": {where}"
        )
    return f"not learned in {format_value(job['job_steps'].max())} steps ({where})"


def probe_jobs(records: pd.DataFrame) -> pd.DataFrame:
    """One row per probe job: its variant, options, protocol, head dim, rate, result (text and
    learned), wall time and commit."""
    trained = _trained(records)
    rows = []
    for _, job in trained.groupby("job_key", sort=False):
        own = job[job[SEQ_LEN] == job[SEQ_LEN].max()]
        seconds = pd.to_numeric(job.get("job_seconds"), errors="coerce").max()
        rows.append(
            {
                ATTENTION: str(job[ATTENTION].iloc[0]),
                "options": _options(job),
                "protocol": _protocol(own),
                "lengths": sorted(int(x) for x in job[SEQ_LEN].unique()),
                "head_dim": _head_dim(job),
                "lr": own["train.lr"].iloc[0] if "train.lr" in own else None,
                "task": str(own["task"].iloc[0]) if "task" in own else "",
                "learned": bool(job["job_learned"].any()),
                "result": result_text(job),
                "seconds": seconds,
                "commit": str(own["git_commit"].iloc[0])[:7] if "git_commit" in own else "",
            }
        )
    return pd.DataFrame(rows)


def _changes(mine: dict[str, object], probe: dict[str, object]) -> list[str]:
    """ "top_k 3 → 16" for each option the probe set otherwise than the row."""
    return [
        f"{key} {_value(mine.get(key))} → {_value(value)}"
        for key, value in probe.items()
        if _value(value) != _value(mine.get(key))
    ]


def sentence(label: str, rows: pd.DataFrame, probes: pd.DataFrame) -> str:
    """One not-learned row against its probes: what each changed and measured, then what that
    says (the first probe that learned names what did not; none: the cause stays open)."""
    mine, head_dim = _options(rows), _head_dim(rows)
    rates = rows["train.lr"].dropna().unique() if "train.lr" in rows else []
    parts, reading = [], None
    for _, probe in probes.sort_values("learned", kind="stable").iterrows():  # learned last
        changes = _changes(mine, probe["options"])
        where = [f"lr {format_value(probe['lr'])}"] if pd.notna(probe["lr"]) else []
        if where and len(rates) == 1 and rates[0] != probe["lr"]:
            where[0] += f", the row's {format_value(rates[0])}"
        if probe["head_dim"] is not None and probe["head_dim"] != head_dim:
            where.insert(0, f"head dim {probe['head_dim']}")
        context = f" ({', '.join(where)})" if where else ""
        parts.append(f"{', '.join(changes)}{context}: {probe['result']}")
        if probe["learned"] and reading is None:
            was = ", ".join(c.split(" → ")[0] for c in changes)
            name = probe[ATTENTION]
            reading = f"what did not learn is {name} with {was}, a property of the method here"
    if reading is None:
        reading = "the cause is not what the probes changed (open)"
    return f"{label}: not learned; " + "; ".join(parts) + f" → {reading}."


def sentences(records: pd.DataFrame, by: Sequence[str], probes: pd.DataFrame) -> list[str]:
    """Per group of `records` (by `by`, e.g. the series, or variant and head dim) none of whose
    jobs learned: its sentence against the probes of the same variant and protocol (those at the
    same head dim when there are any), or that there is none."""
    records = _rows_only(records)
    if "job_learned" not in records or records.empty:
        return []
    out = []
    for key, rows in records.groupby(list(by), sort=False):
        if rows["job_learned"].any():
            continue
        name = str(rows[ATTENTION].iloc[0])
        label = str(key[0] if isinstance(key, tuple) else key)
        if len(by) > 1 and by[1] == "head_dim":
            label = f"{name} at head dim {key[1]}"
        found = pd.DataFrame()
        if len(probes):
            mine = _protocol(rows)
            same = probes["protocol"].map(mine.__eq__).astype(bool)
            found = probes[(probes[ATTENTION] == name) & same]
        if found.empty:
            out.append(f"{label}: not learned; no covering probe on this protocol.")
            continue
        same_dim = found[found["head_dim"] == _head_dim(rows)]
        out.append(sentence(label, rows, same_dim if len(same_dim) else found))
    return out


def note(records: pd.DataFrame, by: Sequence[str], frame: pd.DataFrame | None = None) -> str:
    """ " Not learned, against a covering pattern: ..." for a table's note, or "" when no row
    of `records` is not learned (or no probe records exist at all)."""
    probes = probe_records(frame if frame is not None else records)
    if probes.empty:
        return ""
    jobs = probe_jobs(probes)
    covered = set(jobs["protocol"]) if len(jobs) else set()
    keys = [c for c in PROTOCOL if c in records]
    if len(keys) < len(PROTOCOL):
        return ""
    on_covered = records[records[keys].astype(str).apply(tuple, axis=1).isin(covered)]
    lines = sentences(on_covered, by, jobs)
    if not lines:
        return ""
    return (
        " Not learned, against a covering pattern (+experiment=coverage_probes, "
        "analysis/coverage.py): " + " ".join(lines)
    )


def probe_table(records: pd.DataFrame) -> Table | None:
    """Every probe: variant, options, task and lengths, head dim, rate, result, wall time."""
    jobs = probe_jobs(records)
    if jobs.empty:
        return None
    rows = [
        {
            "variant": job[ATTENTION],
            "options": ", ".join(
                f"{k} {_value(v)}" for k, v in _set_options(job[ATTENTION], job["options"]).items()
            ),
            "task (lengths)": f"{job['task']} ({', '.join(map(str, job['lengths']))})",
            "head dim": job["head_dim"],
            "lr": format_value(job["lr"]) if job["lr"] is not None else "",
            "result": job["result"],
            "wall (s)": f"{job['seconds']:.0f}" if pd.notna(job["seconds"]) else "",
            "commit": job["commit"],
        }
        for _, job in jobs.iterrows()
    ]
    note_text = (
        "Each probe: a not-learned row's variant with a pattern that covers the sequence, on the "
        "row's preset, caps and rate (conf/experiment/coverage_probes/). Result: the control "
        "(shortest length; fewest pairs) and, for capacity, the most pairs; learned: an "
        f"evaluation reached {accuracy.LEARNED:.0%}. Wall: the job's seconds on a shared machine."
    )
    return Table("Covering-pattern probes", pd.DataFrame(rows), note_text)
