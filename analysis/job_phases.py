"""Where a run's wall time went: its jobs cut into launches (one `experiments.run -m` each),
with each launch's jobs, wall time and job seconds and its longest jobs.

A job ran from `timestamp - job_seconds` to `timestamp` (the record's end, UTC). Jobs of one
launch follow each other within a second (the launcher's workers are warm); a new launch
starts a process, imports torch and composes its sweep first (about 12 s here): a pause of more
than `LAUNCH_GAP_S` with no job running starts a new launch. `python -m analysis.job_phases
PATH...` prints the table: docs/running.md's for the main job, from its snapshots.
"""

from __future__ import annotations

import pandas as pd

from analysis import table_command
from analysis.column_names import ATTENTION, SEQ_LEN
from analysis.markdown_table import Table

LAUNCH_GAP_S = 5.0
LONGEST = 3  # jobs named per launch


def launches(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per job with `start`, `end` (UTC) and `launch` (0, 1, ... in time order). A
    job's other records (a curriculum stage's, `<job>/64`; an evaluation point's) are left
    out: its own record, the last to end, holds its whole time."""
    if "job" in frame:
        job_dir = frame["job"].astype(str).str.split("/").str[0]
        frame = frame.loc[frame.groupby(job_dir)["job_seconds"].idxmax()]
    end = pd.to_datetime(frame["timestamp"], utc=True, format="ISO8601")
    jobs = frame.assign(start=end - pd.to_timedelta(frame["job_seconds"], unit="s"), end=end)
    jobs = jobs.sort_values("start", kind="stable").reset_index(drop=True)
    running_until = jobs["end"].cummax().shift()  # the latest end among the earlier jobs
    pause = (jobs["start"] - running_until).dt.total_seconds()
    return jobs.assign(launch=(pause > LAUNCH_GAP_S).cumsum())


def phases(frame: pd.DataFrame) -> Table | None:
    """One row per launch and a total: None without the timing columns."""
    if frame.empty or not {"timestamp", "job_seconds"} <= set(frame):
        return None
    jobs = launches(frame.dropna(subset=["timestamp", "job_seconds"]))
    rows = [_row(group) for _, group in jobs.groupby("launch")]
    wall = (jobs["end"].max() - jobs["start"].min()).total_seconds()
    rows.append(
        {
            "launch": "all, first start to last end",
            "jobs": len(jobs),
            "wall": _minutes(wall),
            "job seconds": f"{jobs['job_seconds'].sum():,.0f}",
            "longest jobs": "",
        }
    )
    note = (
        f"Launches cut where no job ran for over {LAUNCH_GAP_S:g} s; wall from a launch's first "
        "job's start to its last job's end (the process start and the report are outside it)."
    )
    return Table("Where the time went", pd.DataFrame(rows), note)


def _row(group: pd.DataFrame) -> dict:
    first = group["start"].min()
    wall = (group["end"].max() - first).total_seconds()
    longest = group.nlargest(LONGEST, "job_seconds")
    named = ", ".join(
        f"{job[ATTENTION]} L={int(job[SEQ_LEN])} {job['job_seconds']:.0f} s"
        for _, job in longest.iterrows()
    )
    return {
        "launch": f"{first:%H:%M:%S} {_what(group)}",
        "jobs": len(group),
        "wall": _minutes(wall),
        "job seconds": f"{group['job_seconds'].sum():,.0f}",
        "longest jobs": named,
    }


def _what(group: pd.DataFrame) -> str:
    """The sweep, and what all of its jobs share that a sweep's other launches may not: a
    direction, an implementation."""
    parts = [", ".join(sorted(group["sweep"].dropna().astype(str).unique()))]
    causal = group["causal"].dropna().unique() if "causal" in group else []
    if len(causal) == 1:
        parts.append("causal" if causal[0] else "bidirectional")
    impls = group["attention.impl"].dropna().unique() if "attention.impl" in group else []
    if len(impls) == 1 and len(group) == group["attention.impl"].notna().sum():
        parts.append(f"impl={impls[0]}")
    lengths = sorted(group[SEQ_LEN].dropna().astype(int).unique())
    parts.append(f"L={lengths[0]}–{lengths[-1]}" if len(lengths) > 1 else f"L={lengths[0]}")
    return ", ".join(parts)


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.job_phases PATH...`: the launches of the records' run, in time order,
    with their wall time and job seconds."""
    table_command.print_tables(
        "python -m analysis.job_phases",
        main.__doc__,
        [phases],
        "no records with a timestamp and job_seconds",
        argv,
    )


if __name__ == "__main__":
    main()
