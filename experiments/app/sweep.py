"""How a multirun ends: one step in plain order (gather, report, the jobs not ok, exit code).

`SweepEnd` is the app's one Hydra callback (conf/config.yaml, `hydra.callbacks.sweep_end`): at
the multirun's start it checks `fail_on` (an unknown status: one line, exit 2), starts the
sweep's clock and stamps the records already there; as each job ends it gathers the store when
due (experiments/records/index.py); at the end `Multirun.end` gathers the records into
results.csv/.parquet, draws the report and logs the W&B summary run (unless `report=false`),
prints the jobs that did not end ok, and returns the exit code: 1 when one ended in a status of
`fail_on` (default: error), else 0. A code other than 0 ends the process (`SystemExit`); on
Ctrl-C, `Interrupted` carries the multirun to `experiments.run.main`, which ends it and
returns 130. The report is analysis's, a floor above, which this module does not import: the
callback is given its `report_step` (conf/config.yaml names analysis/sweep_report.py's
`update`).

Each step, and how the exit code reaches the process: docs/internals.md, "sweep".
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.app import interrupts, sweep_clock, tracking
from experiments.job_config import check_writable_dir
from experiments.records import index, record, store

log = logging.getLogger("attnbench")

DEFAULT_FAIL_ON = (record.ERROR,)
INTERRUPTED = 130  # the shell's exit code for a process ended by SIGINT
REASON_CHARS = 160

# What draws a sweep's report: `(sweep_dir, logger_cfg, summarize)`, where `summarize(records,
# figures)` logs the W&B summary run (analysis.sweep_report.update, named in conf/config.yaml).
Summarize = Callable[[pd.DataFrame, dict[str, Path]], None]
ReportStep = Callable[[Path, Mapping[str, Any], Summarize], None]


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


@dataclass
class Multirun:
    """One multirun of the app: its config (Hydra's, the sweep's keys and `hydra.*`), the
    records found at its start (`store.record_stamps`: any other record at its end, or one
    rewritten since, is its own), its `fail_on` statuses and what draws its report (None: no
    report, whatever `report` says)."""

    config: DictConfig
    earlier: set[store.Stamp]
    fail_on: tuple[str, ...]
    report_step: ReportStep | None = None
    not_written: list[str] = field(default_factory=list)  # jobs whose record could not be written

    @property
    def sweep_dir(self) -> Path:
        return Path(self.config.hydra.sweep.dir)

    def end(self, *, interrupted: bool = False) -> int:
        """The end of the multirun, in order: gather, report, the jobs not ok; the exit code.

        Each part runs even if the one before raised (as Hydra runs every end-of-multirun
        callback), so a broken report still leaves the table and the exit code. Interrupted
        (Ctrl-C): the same for the jobs that finished, then how to continue; the code is 130.
        """
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a 2nd Ctrl-C: stop now
        if interrupted:
            print("\ninterrupted: gathering the jobs that finished", file=sys.stderr)
        gathered = _part("gather", lambda: store.gather_at_end(self.sweep_dir), default=None)
        if self.config.get("report", True) and self.report_step is not None:
            _part("report", self.report, default=None)
        code = _part("outcome", lambda: self._outcome(gathered), default=1)
        if not interrupted:
            return code
        print(
            f"interrupted: re-run the same command to measure the rest; configurations recorded "
            f"ok in {self.sweep_dir} are not measured again",
            file=sys.stderr,
        )
        return INTERRUPTED

    def report(self) -> None:
        """The sweep's report (`report_step`) and its W&B summary run, redone when its records
        changed."""
        if self.report_step is None:
            return
        logger_cfg = OmegaConf.to_container(self.config.logger, resolve=True)

        def summarize(records: pd.DataFrame, figures: dict[str, Path]) -> None:
            results = self.sweep_dir / "results.parquet"  # the store, gathered just before
            run_dir = tracking.log_sweep_summary(
                logger_cfg,
                records=records,
                figures=figures,
                group=tracking.group_of(str(self.config.sweep), self.sweep_dir),
                out_dir=self.sweep_dir,
                results=results if results.is_file() else None,
            )
            if run_dir is not None:
                print(f"W&B sweep summary run: {run_dir}")

        self.report_step(self.sweep_dir, logger_cfg, summarize)

    def _outcome(self, gathered: pd.DataFrame | None) -> int:
        """Print this multirun's jobs that did not end ok; the exit code (also 1 when the store
        could not be written: `gathered` is None, said when it happened)."""
        unwritten = gathered is None or bool(self.not_written)
        if self.not_written:
            print(
                f"error: {len(self.not_written)} job(s) of this multirun could not write their "
                f"record ({'; '.join(self.not_written)}); re-run the sweep to measure them",
                file=sys.stderr,
            )
        written, _ = store.read_records(self.sweep_dir, unchanged=self.earlier)
        frame = pd.DataFrame(written)
        not_ok = frame[frame["status"] != record.OK] if len(frame) else frame
        if not_ok.empty:
            return int(unwritten)
        print(f"\n{len(not_ok)} job(s) of this multirun did not end ok:")
        everything = store.gather(self.sweep_dir) if gathered is None else gathered
        print(not_ok_table(not_ok, store.key_columns(everything)))
        failing = not_ok[not_ok["status"].isin(self.fail_on)]
        if failing.empty:
            print(
                f"(no job ended {' or '.join(self.fail_on)}: exit code {int(unwritten)}; "
                "fail_on=[error,oom,timeout] makes other statuses fail the sweep)"
            )
            return int(unwritten)
        counts = ", ".join(f"{n} {s}" for s, n in failing["status"].value_counts().items())
        print(
            f"error: {counts} in this sweep (fail_on: {', '.join(self.fail_on)})", file=sys.stderr
        )
        return 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a multirun, carrying it (`multirun`) to `experiments.run.main`."""

    def __init__(self, multirun: Multirun):
        super().__init__()
        self.multirun = multirun


class SweepEnd(Callback):
    """Hydra callback: the multirun's start, the store gathered as each job ends, and the one
    end-of-sweep step (`Multirun.end`); see the module docstring. `report_step` draws the
    report (conf/config.yaml names analysis's); None: no report."""

    def __init__(self, report_step: ReportStep | None = None) -> None:
        self.report_step = report_step
        self.multirun: Multirun | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Launchers ship the callbacks to each job's process, where only on_job_end runs; it
        # needs none of the multirun (and a job's Ctrl-C is its launcher's) nor the report.
        return {"multirun": None, "report_step": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_sweep_name(config)
        value = config.get("fail_on")
        try:
            fail_on = fail_on_statuses(None if value is None else list(value))
            check_writable_dir("hydra.sweep.dir", config.hydra.sweep.dir)  # read-only: one line
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        sweep_dir = Path(config.hydra.sweep.dir)
        self.multirun = multirun = Multirun(
            config, store.record_stamps(sweep_dir), fail_on, self.report_step
        )
        index.rebuild(sweep_dir)  # what resume asks: records changed since are seen
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
        sweep_clock.SweepClock(multirun.sweep_dir).start(
            [*(f"{k}={v}" for k, v in params.items()), *overrides]
        )
        if threading.current_thread() is threading.main_thread():  # where signals arrive
            # Raised again if it lands where Python drops exceptions (a weakref callback).
            signal.signal(signal.SIGINT, interrupts.raising(lambda: Interrupted(multirun)))

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_sweep_name(config)
        try:  # a single run's dir, as the multirun's above
            check_writable_dir("hydra.run.dir", config.hydra.run.dir)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        stop = interrupts.raised()
        if isinstance(stop, Interrupted) and stop.multirun is self.multirun is not None:
            raise stop  # a Ctrl-C that something swallowed: no further job starts

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if config.hydra.get("mode") != RunMode.MULTIRUN:
            return
        if self.multirun is not None and _returned(job_return) is not None:
            self.multirun.not_written.append(str(_returned(job_return)))  # the basic launcher's
        try:  # when due: a rewrite after every job would cost each job the whole sweep
            index.gather_if_due(Path(config.hydra.sweep.dir))
        except Exception as error:  # the end of the multirun gathers again
            log.warning("results not gathered after this job: %s", error)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.multirun is None:
            return
        code = self.multirun.end()
        if code:
            sys.exit(code)


def not_ok_table(frame: pd.DataFrame, keys: list[str]) -> str:
    """job, status, the sweep's keys and the one-line reason of each record in `frame`."""
    keys = [k for k in keys if k in frame]
    table = frame.sort_values("job", key=lambda jobs: jobs.map(_job_order))
    reasons = ["reason", *table["error"].map(_reason)]
    table = table[["job", "status", *keys]].rename(columns=store.short_names(keys))
    lines = table.to_string(index=False, na_rep="").splitlines()
    return "\n".join(f"{line}  {reason}" for line, reason in zip(lines, reasons, strict=True))


def _check_sweep_name(config: DictConfig) -> None:
    """`sweep` names the dirs multirun/<sweep> and outputs/<sweep>: one line and exit 2 if it
    would leave them (`sweep=../../x`), before Hydra creates any dir."""
    try:
        store.check_relative_name("sweep", config.get("sweep", "default"))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _returned(job_return: Any) -> Exception | None:
    """What a job that could not write its record returned (`experiments.run.app`), else None."""
    from hydra.core.utils import JobStatus

    if job_return is None or getattr(job_return, "status", None) != JobStatus.COMPLETED:
        return None
    value = job_return.return_value
    return value if isinstance(value, OSError) else None


def _part(name: str, run: Callable[[], Any], *, default: Any) -> Any:
    """`run()`; if it raises, a warning naming the part, and `default` (the next part runs)."""
    try:
        return run()
    except Exception as error:  # as Hydra: one part's failure does not stop the rest
        warnings.warn(f"end of the sweep: {name} failed: {error}", stacklevel=1)
        return default


def _reason(error: Any) -> str:
    text = "" if error is None or (isinstance(error, float) and pd.isna(error)) else str(error)
    text = " ".join(text.split())
    return text[:REASON_CHARS] + ("…" if len(text) > REASON_CHARS else "")


def _job_order(job: Any) -> tuple:
    text = str(job)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)
