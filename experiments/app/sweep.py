"""How a multirun ends for its user: the jobs that did not end ok, the exit code, and Ctrl-C.

`SweepOutcome` (a Hydra callback, registered in conf/config.yaml) notes when a multirun starts;
at its end it collects the records this multirun wrote that did not end ok. `experiments.run`'s
`main` then calls `finish()`, which prints them as one table (status, the keys that vary in the
sweep, the one-line reason) and returns the exit code: 1 when one of them ended in a status of
`fail_on` (default: error, i.e. an invalid option or a crash), else 0 — skipped (an unsupported
combination), oom, timeout and diverged are results. On Ctrl-C, `interrupted()` runs every
configured end-of-multirun callback itself, so results.csv and the report hold the jobs that
finished, and says how to continue.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from experiments.app import progress
from experiments.records import record, store

DEFAULT_FAIL_ON = (record.ERROR,)
INTERRUPTED = 130  # the shell's exit code for a process ended by SIGINT
REASON_CHARS = 160


@dataclass
class _Multirun:
    config: DictConfig
    started: float  # time.time() at the start: the records written since are this multirun's
    fail_on: tuple[str, ...]
    not_ok: pd.DataFrame | None = None  # set at the end
    keys: list[str] = field(default_factory=list)


_current: _Multirun | None = None


def fail_on_statuses(value: Any) -> tuple[str, ...]:
    """`fail_on` from the config as statuses; `ValueError` naming the option if one is unknown."""
    if isinstance(value, str):  # fail_on=oom on the command line
        value = [value]
    statuses = tuple(DEFAULT_FAIL_ON if value is None else value)
    known = [s for s in record.STATUSES if s != record.OK]
    unknown = [s for s in statuses if s not in known]
    if unknown:
        raise ValueError(
            f"config: option 'fail_on' must list statuses among {', '.join(known)}; "
            f"got {unknown[0]!r}"
        )
    return statuses


class SweepOutcome(Callback):
    """Hydra callback: remembers the multirun, and at its end which of its jobs did not end ok."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _current
        value = config.get("fail_on")
        try:
            fail_on = fail_on_statuses(None if value is None else list(value))
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        # File times have a coarser clock on some file systems: a second of slack.
        _current = _Multirun(config, time.time() - 1.0, fail_on)
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
        progress.SweepClock(Path(config.hydra.sweep.dir)).start(
            [*(f"{k}={v}" for k, v in params.items()), *overrides]
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if _current is None:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        written, _ = store.read_records(sweep_dir, since=_current.started)
        frame = pd.DataFrame(written)
        _current.keys = store.key_columns(store.gather(sweep_dir))
        _current.not_ok = frame[frame["status"] != record.OK] if len(frame) else frame


def finish() -> int:
    """After a multirun: print the table of its jobs that did not end ok; the exit code (also 1
    when its results could not be gathered: `store.gather_failure`, named when it happened)."""
    if _current is None:
        return 0
    unwritten = store.gather_failure(Path(_current.config.hydra.sweep.dir)) is not None
    if _current.not_ok is None or _current.not_ok.empty:
        return int(unwritten)
    not_ok, fail_on = _current.not_ok, _current.fail_on
    print(f"\n{len(not_ok)} job(s) of this multirun did not end ok:")
    print(not_ok_table(not_ok, _current.keys))
    failing = not_ok[not_ok["status"].isin(fail_on)]
    if failing.empty:
        print(
            f"(no job ended {' or '.join(fail_on)}: exit code {int(unwritten)}; "
            "fail_on=[error,oom,timeout] makes other statuses fail the sweep)"
        )
        return int(unwritten)
    counts = ", ".join(f"{n} {s}" for s, n in failing["status"].value_counts().items())
    print(f"error: {counts} in this sweep (fail_on: {', '.join(fail_on)})", file=sys.stderr)
    return 1


def not_ok_table(frame: pd.DataFrame, keys: list[str]) -> str:
    """job, status, the sweep's keys and the one-line reason of each record in `frame`."""
    keys = [k for k in keys if k in frame]
    table = frame.sort_values("job", key=lambda jobs: jobs.map(_job_order))
    reasons = ["reason", *table["error"].map(_reason)]
    table = table[["job", "status", *keys]].rename(columns=store.short_names(keys))
    lines = table.to_string(index=False, na_rep="").splitlines()
    return "\n".join(f"{line}  {reason}" for line, reason in zip(lines, reasons, strict=True))


def interrupted() -> int:
    """Ctrl-C during a multirun: gather and report what finished; the exit code (130)."""
    if _current is None:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    config = _current.config
    print("\ninterrupted: gathering the jobs that finished", file=sys.stderr)
    callbacks = [instantiate(c) for c in (config.hydra.get("callbacks") or {}).values()]
    for callback in reversed(callbacks):  # the order Hydra ends a multirun in
        try:
            callback.on_multirun_end(config=config)
        except Exception as error:  # as Hydra: one callback's failure does not stop the rest
            warnings.warn(
                f"{type(callback).__name__}.on_multirun_end failed: {error}", stacklevel=1
            )
    finish()
    print(
        f"interrupted: re-run the same command to measure the rest; configurations recorded "
        f"ok in {config.hydra.sweep.dir} are not measured again",
        file=sys.stderr,
    )
    return INTERRUPTED


def _reason(error: Any) -> str:
    text = "" if error is None or (isinstance(error, float) and pd.isna(error)) else str(error)
    text = " ".join(text.split())
    return text[:REASON_CHARS] + ("…" if len(text) > REASON_CHARS else "")


def _job_order(job: Any) -> tuple:
    text = str(job)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)
