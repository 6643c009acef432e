"""The entry point: `attnbench [overrides]` (= `python -m experiments.run`), the Hydra app.

Each job Hydra launches is `app`: the resolved config, with the launcher's threads per job, is
measured and recorded by `experiments.app.job.run_job`. A single run that did not end ok prints
one line and exits 1; in a sweep the job returns normally so every other job still runs, and the
multirun's one end-of-sweep step (experiments/app/sweep.py) gathers, reports, lists the jobs that
did not end ok and sets the exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.measurement import allocator

# An entry point: the allocator's variable is set here, before the imports below start torch
# (c10 reads it once); `import experiments` itself changes no environment variable.
allocator.enable_by_default()

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments.app import interrupts, job_dirs, parent, plugin_options, sweep, sweep_clock
from experiments.app import job as jobs
from experiments.app.resolvers import TunedTableError, config_dir, lr_source_of, register
from experiments.job_config import added_keys, check_required_keys
from experiments.records import record, store
from experiments.training import progress

register()


@hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> jobs.NotWritten | None:
    """One job: the resolved config measured and recorded (`experiments.app.job.run_job`)."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    parent.exit_with_parent()  # in a launcher's worker process: not past the sweep's end
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        # Before resolving: a damaged tuned table is one line, not a Hydra traceback.
        lr_source = lr_source_of(cfg)
    except TunedTableError as error:
        print(f"error: config: {error}", file=sys.stderr)
        sys.exit(2)
    config = job_dirs.job_config(cfg, hydra_cfg)  # what its dir is named by (`${job_dir:}`)
    try:
        check_required_keys(config)  # `~seq_len`: no job can be recorded without it
        plugin_options.load(config.get("plugins") or [])  # in a launcher's worker too
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    # The job is its dir's name: its configuration's (`job_dirs`, the default subdir), so
    # unique in its sweep dir whatever multirun wrote it (analysis tells a job's records apart
    # by sweep and job: `accuracy.job_key`).
    job = out_dir.name
    if multirun and progress.enabled(config["train"].get("progress")):
        clock = sweep_clock.SweepClock(sweep_dir)
        line = clock.line(str(hydra_cfg.job.num), list(hydra_cfg.overrides.task))
        if line:
            print(f"sweep: {line}", file=sys.stderr, flush=True)
    added = added_keys(list(hydra_cfg.overrides.task), hydra_cfg.runtime.choices.keys())
    try:
        rec = jobs.run_job(
            config,
            out_dir,
            job=job,
            sweep_dir=sweep_dir,
            added=added,
            parallel_jobs=job_dirs.parallel_jobs(hydra_cfg) if multirun else 1,
            lr_source=lr_source,
        )
    except jobs.NotWritten as error:  # a full disk: one line; a sweep goes on to its end
        print(f"error: {error}", file=sys.stderr, flush=True)
        if not multirun:
            sys.exit(1)
        return error  # the end of the sweep counts it (sweep.SweepEnd.on_job_end)
    if rec is None:
        return
    print(store.format_records([rec]))
    if rec["status"] != record.OK and multirun:  # the sweep's end lists it again, with the others
        print(f"{rec['status']}: {rec['error']}")
    print(f"record: {out_dir / 'result.json'}")
    if rec.get("offline_run_dir"):
        print(f"W&B run: {rec['offline_run_dir']}")
    if rec["status"] != record.OK and not multirun:
        print(f"error: {rec['error']}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """The `attnbench` command: the Hydra app; on Ctrl-C, the end of the interrupted multirun.

    Exit codes: 0 done; 1 a single run did not end ok, or a job of a multirun ended in a status
    of `fail_on` (default: error; the end of the multirun exits so itself:
    experiments/app/sweep.py); 130 interrupted (Ctrl-C), after gathering what finished, the
    process ended within `interrupts.EXIT_GRACE_S` whatever its exit waits on.
    """
    parent.mark_launcher()  # jobs in other processes (joblib's workers) end with this one
    try:
        plugin_options.prepare(sys.argv[1:])  # before Hydra composes: `attention=<a plugin's>`
    except ValueError as error:  # a plugin that does not import, or a default not a config value
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        app()
        code = 0
    except sweep.Interrupted as stop:  # Ctrl-C in a multirun, which the interrupt carries
        code = _end_interrupted(stop)
    except KeyboardInterrupt:  # a single run, or before a multirun started
        print("interrupted", file=sys.stderr)
        code = sweep.INTERRUPTED
    except SystemExit as error:
        stop = interrupts.raised()
        if not (isinstance(stop, sweep.Interrupted) and error.code):
            raise
        # Hydra's exit after an error that replaced the Ctrl-C as it propagated (it printed
        # the error): the sweep was interrupted all the same.
        code = _end_interrupted(stop)
    if code == sweep.INTERRUPTED:  # nothing is left to do: the exit must not wait on anything
        interrupts.exit_within(code)
    sys.exit(code)


def _end_interrupted(stop: sweep.Interrupted) -> int:
    """The end of the multirun a Ctrl-C interrupted (130); a second Ctrl-C: stop now."""
    try:
        return stop.multirun.end(interrupted=True)
    except KeyboardInterrupt:
        return sweep.INTERRUPTED


if __name__ == "__main__":
    main()
