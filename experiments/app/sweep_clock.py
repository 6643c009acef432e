"""A sign of life on a long sweep: a line per job, "job i of N", elapsed and ETA.

Like the bar over a job's training steps it is on by default in a terminal and quiet when the
output is not one; `train.progress` sets both (`enabled`, experiments/training/progress.py).

`SweepClock`: at the start of a multirun, the sweep's start time and number of jobs go to
`<sweep dir>/.multirun.json`; every job then prints "job i of N" with the time spent and an
estimate of the time left, from the jobs that already wrote their record. It works the same with
the basic launcher (one process) and with joblib or submitit (one process per job).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

STATE = ".multirun.json"  # inside the sweep dir


class SweepClock:
    """The multirun's start and size, shared by its jobs through a file in the sweep dir."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / STATE

    def start(self, overrides: list[str]) -> None:
        """Note that a multirun of these overrides (the sweeper's and the command line's)
        starts now: its number of jobs and the keys it sweeps."""
        total, keys = sweep_size(overrides)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"started": time.time(), "total": total, "swept": keys}
        self.path.write_text(json.dumps(state))

    def line(self, job: str, overrides: list[str]) -> str | None:
        """'job 5 of 26 (attention=lsh seed=1): 4 done in 3:10, about 17:25 left' for the job
        with these overrides (those of the swept keys are shown), or None if no multirun was
        started in this sweep dir."""
        try:
            state = json.loads(self.path.read_text())
            started, total = float(state["started"]), state.get("total")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # damaged: no line
            return None
        swept = set(state.get("swept") or ())
        description = " ".join(o for o in overrides if o.split("=", 1)[0] in swept) or "-"
        elapsed = time.time() - started
        done = sum(
            1
            for path in self.path.parent.glob("*/result.json")
            if _mtime(path) >= started - 1.0  # a second of slack for coarse file clocks
        )
        position = f"job {int(job) + 1} of {total}" if job.isdigit() and total else f"job {job}"
        text = f"{position} ({description}): {done} done in {_clock(elapsed)}"
        if total and done:
            left = elapsed / done * max(0, total - done)
            text += f", about {_clock(left)} left"
        return text


def sweep_size(overrides: list[str]) -> tuple[int | None, list[str]]:
    """The number of jobs a multirun of these overrides launches (the basic sweeper's
    cartesian product of every comma list or range) and the keys it sweeps; (None, []) if it
    cannot be told."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 — an estimate only; Hydra reports bad overrides itself
        return None, []
    by_key = {o.get_key_element(): o for o in parsed}  # a later override of a key wins
    size, keys = 1, []
    for key, override in by_key.items():
        if override.is_sweep_override():
            size *= len(list(override.sweep_string_iterator()))
            keys.append(key)
    return size, keys


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -math.inf


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
