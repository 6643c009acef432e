"""The entry point: `attnbench [overrides]` (= `python -m experiments.run`), the Hydra app.

Each job Hydra launches is `app`: the resolved config, with the launcher's threads per job, is
measured and recorded by `experiments.app.job.run_job`. A single run that did not end ok prints
one line and exits 1; in a sweep the job returns normally so every other job still runs, and the
multirun's one end-of-sweep step (experiments/app/sweep.py) gathers, reports, lists the jobs that
did not end ok and sets the exit code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from experiments.measurement import allocator

# An entry point: the allocator's variable is set here, before the imports below start torch
# (c10 reads it once); `import experiments` itself changes no environment variable.
allocator.enable_by_default()

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.app import job as jobs
from experiments.app import parent, plugin_options, sweep, sweep_clock
from experiments.app.resolvers import TunedTableError, config_dir, lr_source_of, register
from experiments.job_config import added_keys, check_required_keys
from experiments.records import record, store
from experiments.training import progress

register()


def _parallel_jobs(hydra_cfg) -> int:
    """Jobs the launcher runs side by side: joblib's n_jobs (-1: every core), else 1."""
    launcher = hydra_cfg.launcher
    if "joblib" not in str(launcher.get("_target_", "")).lower():
        return 1
    n_jobs = int(launcher.get("n_jobs", -1))
    return (os.cpu_count() or 1) if n_jobs <= 0 else n_jobs


def _threads_per_job(hydra_cfg) -> int | None:
    """With the joblib launcher, split the cores between the parallel jobs (None = torch default).

    n_jobs processes each using every core oversubscribe the machine and make every timing
    slower and noisier; giving each job cores // n_jobs threads keeps them apart.
    """
    if "joblib" not in str(hydra_cfg.launcher.get("_target_", "")).lower():
        return None
    return max(1, (os.cpu_count() or 1) // _parallel_jobs(hydra_cfg))


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
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        check_required_keys(config)  # `~seq_len`: no job can be recorded without it
        plugin_options.load(config.get("plugins") or [])  # in a launcher's worker too
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if config["threads"] is None:
        config["threads"] = _threads_per_job(hydra_cfg)
    sweep_dir = Path(hydra_cfg.sweep.dir) if multirun else None
    # The job is its dir's name: hydra.job.num under the default subdir, and unique where a
    # second multirun into the same sweep dir names its own subdirs (job numbers restart at 0,
    # and analysis tells a job's records apart by sweep and job: `accuracy.job_key`).
    job = out_dir.name
    if multirun and progress.enabled(config["train"].get("progress")):
        line = sweep_clock.SweepClock(sweep_dir).line(job, list(hydra_cfg.overrides.task))
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
            parallel_jobs=_parallel_jobs(hydra_cfg) if multirun else 1,
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
    experiments/app/sweep.py); 130 interrupted (Ctrl-C), after gathering what finished.
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
        try:
            code = stop.multirun.end(interrupted=True)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            code = sweep.INTERRUPTED
    except KeyboardInterrupt:  # a single run, or before a multirun started
        print("interrupted", file=sys.stderr)
        code = sweep.INTERRUPTED
    sys.exit(code)


if __name__ == "__main__":
    main()
