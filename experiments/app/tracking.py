"""Weights & Biases tracking for the experiment runner, offline by default.

A job calls `start_tracker(cfg.logger, ...)`, logs training steps with `Tracker.log_step`, and
hands its finished record to `Tracker.finish`. With `logger=none`, `mode: disabled`, or when W&B
cannot start, the tracker is a no-op: tracking never stops a job from recording its result
locally. WANDB_MODE, when set, wins over `logger.mode`. Nothing here reads W&B's offline logs:
the record and the per-step history are kept locally whatever the logger.

One run per configuration of a sweep, and one summary run per sweep, however often the sweep is
re-run: their ids come from the sweep's name, the sweep dir's identity (`<sweep dir>/.sweep_id`)
and the configuration's hash, so a re-measured configuration replaces its offline run and
resumes its online one. A job interrupted by Ctrl-C discards its run.

Mode precedence, offline folders and how run ids are kept unique: docs/internals.md,
"tracking".
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import MISSING

from experiments.records import history, record

if TYPE_CHECKING:
    import pandas

log = logging.getLogger(__name__)

# How long an interrupted job's run may take to close: W&B 0.31 can wait forever in
# `wandb.teardown()` when Ctrl-C arrived during one of its calls (seen once in a test run).
CLOSE_AFTER_INTERRUPT_S = 10.0
MODES = ("online", "offline", "disabled", "dryrun")  # dryrun is W&B's old name for offline
STEP_AXIS = history.STEP_AXIS  # x-axis of per-step training curves
SCALING_AXIS = "seq_len"  # x-axis of per-job cost measurements
MAX_TAG_CHARS = 64  # W&B rejects the whole run for a longer tag
SWEEP_ID_FILE = ".sweep_id"  # in a sweep dir: the token its W&B run ids carry
_SWEEP_ID = re.compile(r"[a-z0-9]{8}")

# Why W&B is off for the rest of this process after a failed start (None while it is not): a
# failure such as no network would otherwise cost every later job of a sweep its init timeout.
_disabled_reason: str | None = None


@dataclass
class WandbLogger:
    """The schema of `conf/logger/wandb.yaml` (registered with Hydra by resolvers.py `register`):
    its types are checked when Hydra composes the config, the values are the YAML's.
    `scaling_metrics` defaults to the record schema's (`record.SCALING_METRICS`)."""

    name: str = MISSING
    mode: str = MISSING
    project: str = MISSING
    entity: Optional[str] = MISSING  # noqa: UP045  (OmegaConf reads Optional, not `str | None`)
    tags: list[str] = MISSING
    dir: Optional[str] = MISSING  # noqa: UP045
    quiet: bool = MISSING
    capture_console: bool = MISSING
    init_timeout: float = MISSING
    scaling_metrics: list[str] = field(default_factory=lambda: list(record.SCALING_METRICS))


class Tracker:
    """No-op tracker: what a job gets when W&B is off.

    `run_dir` is the run's local folder (`offline-run-*`, or `run-*` online), None when off.
    """

    run_dir: pathlib.Path | None = None

    def log_step(self, metrics: dict[str, float], step: int) -> None:
        """Log per-step training metrics at `step` (nothing here)."""

    def finish(self, rec: dict, exit_code: int) -> None:
        """Store the job's record `rec` and close the run (nothing here)."""

    def discard(self) -> None:
        """Close the run of a job that will leave no record, and delete it if offline."""


class _WandbTracker(Tracker):
    """One W&B run per job; a W&B error after start turns it into a no-op with a warning."""

    def __init__(self, run: Any, scaling_metrics: Sequence[str], offline: bool):
        self._run = run
        self._scaling_metrics = tuple(scaling_metrics)
        self._offline = offline
        self.run_dir = pathlib.Path(run.settings.sync_dir)

    def log_step(self, metrics: dict[str, float], step: int) -> None:
        """Log `metrics` on the step axis; bare names go under `train/` (`loss` -> `train/loss`)."""
        if self._run is None:
            return
        row = {history.metric_name(k): v for k, v in metrics.items()}
        self._guard(self._run.log, {**row, STEP_AXIS: step})

    def finish(self, rec: dict, exit_code: int) -> None:
        """Copy every column of the record `rec` into the run summary, then close the run.

        None is written as null, which W&B keeps as "no value": it clears what an earlier
        attempt of a resumed (online) run left there, e.g. its error.
        The cost columns named in `scaling_metrics` are also logged as one history row against
        `seq_len`, so that W&B charts grouped by sweep can draw them over sequence length.
        `exit_code != 0` marks the run failed. On return the run is complete on disk.
        """
        if self._run is None:
            return
        run, self._run = self._run, None
        scaling = {k: rec[k] for k in self._scaling_metrics if record.is_number(rec.get(k))}
        if scaling and record.is_number(rec.get(SCALING_AXIS)):
            self._guard(run.log, {SCALING_AXIS: rec[SCALING_AXIS], **scaling})
        # The config is the run's config, not its summary; a curve's last point (`eval/loss`)
        # is the record's column (`eval_loss`): one name per metric.
        config = {*record.config_keys(rec), *record.ALIASES.values(), *record.RESOLVED.values()}
        measured = {k: v for k, v in rec.items() if k not in config}
        self._guard(run.summary.update, measured)
        self._guard(_close, run, exit_code)

    def discard(self) -> None:
        """Close the run unfinished; offline, delete its folder, so no failed run is left beside
        the one a re-run records (online, the re-run resumes this run by its id)."""
        run, self._run = self._run, None
        if run is not None:
            self._guard(_close_within, run, 255, CLOSE_AFTER_INTERRUPT_S)
        if self._offline and self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def _guard(self, call, *args, **kwargs) -> None:
        try:
            call(*args, **kwargs)
        except Exception as error:  # tracking must never fail the job
            log.warning(
                "W&B call %s failed, run left as is: %s", call.__name__, record.one_line(error)
            )
            self._run = None


def start_tracker(
    logger_cfg: Mapping | None,
    *,
    run_config: Mapping,
    group: str,
    job_type: str,
    tags: Sequence[str],
    name: str,
    out_dir: pathlib.Path,
    run_id: str | Callable[[], str] | None = None,
    replace_in: pathlib.Path | None = None,
) -> Tracker:
    """Start this job's W&B run as configured by `conf/logger/*.yaml`; a no-op tracker if off.

    `run_config` is the resolved job config (nested plain mapping); `group` is usually the sweep;
    the run is written under `logger.dir`, or `out_dir` when that is null. Several calls in one
    process (Hydra's basic launcher) each get their own run: a run still open is finished first.
    With `run_id` (a sweep's job: `run_id(sweep, config_hash, sweep_dir)`, or a function
    that makes it, called only when W&B is on: it may write `.sweep_id`), offline runs of
    that id under `logger.dir`, else `replace_in` (the sweep dir), are deleted first, and an
    online run of that id is resumed.
    If W&B fails to start, one warning is logged and W&B stays off for the rest of the process.
    Raises ValueError for a mode W&B does not know.
    """
    mode = _mode(logger_cfg)
    if mode is None:
        return Tracker()
    _check_scaling_metrics(logger_cfg.get("scaling_metrics", record.SCALING_METRICS) or [])
    if callable(run_id):
        try:
            run_id = run_id()
        except OSError as error:  # e.g. `.sweep_id` on a full disk: the record is still kept
            log.warning("W&B is off for this job: %s", record.one_line(error))
            return Tracker()
    if run_id is not None and mode != "online":
        remove_offline_runs(pathlib.Path(logger_cfg.get("dir") or replace_in or out_dir), run_id)
    run = _init_run(
        logger_cfg,
        mode,
        config=_plain(run_config),
        group=group,
        job_type=job_type,
        tags=tags,
        name=name,
        out_dir=out_dir,
        run_id=run_id,
    )
    if run is None:
        return Tracker()
    scaling_metrics = list(logger_cfg.get("scaling_metrics", record.SCALING_METRICS) or [])
    try:
        _define_metrics(run, scaling_metrics)
    except Exception as error:  # charts lose their axes, the run is still fine
        log.warning("W&B define_metric failed: %s", record.one_line(error))
    return _WandbTracker(run, scaling_metrics, offline=mode != "online")


DEFAULT_SWEEP = "default"  # conf/config.yaml's `sweep`


def group_of(sweep: str, sweep_dir: pathlib.Path | None) -> str:
    """A sweep's W&B group: its `sweep` name, or, left at the default, its dir's name (two
    sweeps into two dirs are two groups, not one `default`)."""
    if sweep == DEFAULT_SWEEP and sweep_dir is not None:
        return pathlib.Path(sweep_dir).resolve().name
    return sweep


def run_name(rec: Mapping, digest: str) -> str:
    """A job's W&B run name: what ran, e.g. `linear-L256-residual-421e3a` (variant, length,
    block, the stack where layers mix, and the config hash's head to tell the rest apart)."""
    parts = [str(rec.get("attention")), f"L{rec.get('seq_len')}", str(rec.get("block"))]
    if rec.get("layers") and rec.get("layers") != rec.get("attention"):
        parts.append(str(rec["layers"]))
    return "-".join([*parts, digest[:6]])


def run_id(sweep: str, key: str, sweep_dir: pathlib.Path) -> str:
    """The W&B run id of `key` (a config hash, or "summary") in sweep `sweep` recorded in
    `sweep_dir`: the same at every re-run of that sweep dir, different in any other (`sweep_id`).
    W&B ids allow letters, digits, `-` and `_`; this one has at most 62 characters."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", str(sweep)).strip("-")[:40] or "sweep"
    return f"{slug}-{sweep_id(sweep_dir)}-{key}"


def sweep_id(sweep_dir: pathlib.Path) -> str:
    """The identity of a sweep dir: 8 random characters in `<sweep_dir>/.sweep_id`, made by the
    first job that asks (atomically, so parallel jobs agree) and kept for good. A damaged file,
    or a symlink (never followed, its target never read), is replaced with a warning that
    quotes nothing of it: the dir's earlier runs are then left as they are. A file that cannot
    be written (a full disk) raises an `OSError` naming it, and leaves no temporary file."""
    path = pathlib.Path(sweep_dir) / SWEEP_ID_FILE
    for _ in range(2):
        token = _read_sweep_id(path)
        if token is not None:
            return token
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{SWEEP_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            tmp.write_text(secrets.token_hex(4) + "\n")
            os.link(tmp, path)  # creates `path` whole, or fails if another job was first
        except FileExistsError:
            pass
        except OSError as error:  # a write names no file, the temporary one is not the point
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        finally:
            tmp.unlink(missing_ok=True)
    token = _read_sweep_id(path)
    if token is None:
        raise OSError(f"{path}: no sweep identity could be made")
    return token


def _read_sweep_id(path: pathlib.Path) -> str | None:
    """The token in `path`; None if there is none. A symlink or a damaged file is removed,
    with a warning (its content, or its target, is not quoted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        if not path.is_symlink():
            raise
        log.warning("%s is a symlink, not followed; the sweep dir gets a new identity", path)
        path.unlink(missing_ok=True)
        return None
    with os.fdopen(fd, "rb") as file:
        content = file.read(64)
    token = content.decode("ascii", errors="replace").strip()
    if _SWEEP_ID.fullmatch(token):
        return token
    log.warning(
        "%s is damaged (not 8 lowercase letters or digits); the sweep dir gets a new identity",
        path,
    )
    path.unlink(missing_ok=True)
    return None


def offline_run_dirs(root: pathlib.Path, run_id: str | None = None) -> list[pathlib.Path]:
    """The offline run folders below `root` (of `run_id` only, if given), sorted, found by the
    name W&B gives them, `offline-run-<yyyymmdd_hhmmss>-<run id>` (a `-<n>` suffix when a run
    of that id started twice in one second); their contents are W&B's and are never read."""
    run = re.escape(run_id) if run_id is not None else r"[A-Za-z0-9_-]+"
    name = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{run}(-\d+)?")
    root = pathlib.Path(root)
    found = root.rglob("offline-run-*") if root.is_dir() else ()
    return sorted(path for path in found if path.is_dir() and name.fullmatch(path.name))


def remove_offline_runs(root: pathlib.Path, run_id: str) -> list[pathlib.Path]:
    """Delete every offline run folder of `run_id` below `root` (a superseded measurement)."""
    removed = offline_run_dirs(root, run_id)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def log_sweep_summary(
    logger_cfg: Mapping | None,
    *,
    records: pandas.DataFrame,
    figures: Mapping[str, pathlib.Path],
    group: str,
    out_dir: pathlib.Path,
    results: pathlib.Path | None = None,
) -> pathlib.Path | None:
    """Log a sweep's records as a W&B Table plus its figures (PNG paths) in one run; its run dir.

    The run has job_type `sweep-summary` and the sweep's `group`; the table is under the key
    `records` (a file `files/<path>` of the run, `path` given in its summary), each figure under
    `figures/<name>`, and `results` (the sweep's results.parquet, if given) as an artifact of
    type `results` named `run_id(group, "results", out_dir)`, so the typed table travels with
    the run. One summary run per sweep dir (`out_dir`): a re-run replaces (offline) or resumes
    (online) the last one. None if W&B is off.
    """
    import wandb

    mode = _mode(logger_cfg)
    if mode is None:
        return None
    summary_id = run_id(group, "summary", out_dir)
    if mode != "online":
        remove_offline_runs(pathlib.Path(logger_cfg.get("dir") or out_dir), summary_id)
    run = _init_run(
        logger_cfg,
        mode,
        config={"sweep": group, "n_records": len(records)},
        group=group,
        job_type="sweep-summary",
        tags=[],
        name=f"{group}-summary",
        out_dir=out_dir,
        run_id=summary_id,
    )
    if run is None:
        return None
    run_dir, exit_code = pathlib.Path(run.settings.sync_dir), 0
    try:
        table = wandb.Table(dataframe=records.reset_index(drop=True), allow_mixed_types=True)
        images = {f"figures/{key}": wandb.Image(str(path)) for key, path in figures.items()}
        run.log({"records": table, **images})
        if results is not None:
            artifact = wandb.Artifact(run_id(group, "results", out_dir), type="results")
            artifact.add_file(str(results))
            run.log_artifact(artifact)
    except Exception as error:  # the sweep's local results are already written
        log.warning("W&B sweep summary failed: %s", record.one_line(error))
        exit_code = 1
    try:
        _close(run, exit_code)
    except Exception as error:
        log.warning("W&B sweep summary failed to finish: %s", record.one_line(error))
    return run_dir


def _mode(logger_cfg: Mapping | None) -> str | None:
    """W&B mode after precedence (WANDB_MODE > logger.mode), or None when W&B is off."""
    if not logger_cfg or logger_cfg.get("name", "none") != "wandb" or _disabled_reason:
        return None
    from_env = os.environ.get("WANDB_MODE")
    mode = from_env or logger_cfg.get("mode") or "offline"
    if mode not in MODES:
        source = "environment variable WANDB_MODE" if from_env else "logger.mode"
        raise ValueError(f"logger wandb: {source}={mode!r} must be one of {', '.join(MODES)}")
    return None if mode == "disabled" else mode


def _check_scaling_metrics(names: Sequence[str]) -> None:
    """Every `logger.scaling_metrics` entry must be a numeric record column (the schema's)."""
    for name in names:
        column = record.column(name)
        if column is None or not column.numeric:
            raise ValueError(
                f"logger wandb: option 'scaling_metrics' lists {name!r}, which is not a numeric "
                f"record column; e.g. {', '.join(record.SCALING_METRICS)}"
            )


def _init_run(
    logger_cfg: Mapping, mode: str, *, config, group, job_type, tags, name, out_dir, run_id=None
):
    """`wandb.init` with quiet, fast settings; None (and one warning) if W&B fails to start."""
    global _disabled_reason
    import wandb

    run_dir = pathlib.Path(logger_cfg.get("dir") or out_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            mode=mode,
            project=logger_cfg.get("project"),
            entity=logger_cfg.get("entity"),
            group=group,
            job_type=job_type,
            tags=_tags([*(logger_cfg.get("tags") or []), *tags]),
            name=name,
            config=config,
            dir=str(run_dir),
            **({"id": run_id, "resume": "allow"} if run_id else {}),
            settings=wandb.Settings(**_settings(logger_cfg)),
        )
    except Exception as error:  # any failure: record locally without W&B
        _disabled_reason = record.one_line(error)
        log.warning("W&B is off for the rest of this process (%s mode): %s", mode, _disabled_reason)
        return None


def _close(run: Any, exit_code: int) -> None:
    """Finish `run` and stop the W&B service until the next run starts it (~0.2 s later).

    `run.finish()` returns before W&B's service has written the run's transaction log out; the
    teardown waits for it, so the run is complete on disk when we return, and no service lingers
    after a sweep's last job. It also finishes any other open run of this process.
    """
    import wandb

    run.finish(exit_code=exit_code)
    wandb.teardown()


def _close_within(run: Any, exit_code: int, seconds: float) -> None:
    """`_close`, given up after `seconds` with a warning (it goes on in a daemon thread, which
    the process's exit does not wait for): an interrupted job must not hang on W&B."""
    closing = threading.Thread(
        target=_close, args=(run, exit_code), name="attnbench-wandb-close", daemon=True
    )
    closing.start()
    closing.join(seconds)
    if closing.is_alive():
        log.warning(
            "W&B's run did not close within %g s of the interrupt; going on without it", seconds
        )


def _settings(logger_cfg: Mapping) -> dict[str, Any]:
    """wandb.Settings for a benchmark: no background sampling, no code/git capture, quiet.

    System-metric sampling would compete with the timed kernels for the CPU; code, git, machine
    and requirements capture add start-up work and duplicate the record's provenance columns.
    Keys that the installed wandb does not know are dropped, so an older or newer wandb starts.
    """
    import wandb

    quiet = bool(logger_cfg.get("quiet", True))
    settings = {
        "reinit": "finish_previous",  # one open run at a time; a job that leaked one closes it
        "silent": quiet,
        "quiet": quiet,
        "console": "auto" if logger_cfg.get("capture_console", False) else "off",
        "init_timeout": float(logger_cfg.get("init_timeout", 90)),
        "save_code": False,
        "disable_code": True,
        "disable_git": True,
        "disable_job_creation": True,
        "x_save_requirements": False,
        "x_disable_stats": True,
        "x_disable_meta": True,
        "x_disable_machine_info": True,
    }
    known = getattr(wandb.Settings, "model_fields", None)
    return settings if known is None else {k: v for k, v in settings.items() if k in known}


def _define_metrics(run: Any, scaling_metrics: Sequence[str]) -> None:
    """Training curves against `step`, per-job costs against `seq_len` (W&B chart x-axes)."""
    run.define_metric(STEP_AXIS)
    # A curve keeps no summary of its own: its final value is the record's column
    # (`eval/loss` -> `eval_loss`), one name per metric.
    run.define_metric("train/*", step_metric=STEP_AXIS, summary="none")
    run.define_metric("eval/*", step_metric=STEP_AXIS, summary="none")
    run.define_metric(SCALING_AXIS)
    for metric in scaling_metrics:
        run.define_metric(metric, step_metric=SCALING_AXIS)


def _tags(tags: Sequence[str]) -> list[str]:
    """Distinct, non-empty tags cut to W&B's limit, in their first order."""
    cut = (str(tag)[:MAX_TAG_CHARS] for tag in tags if str(tag))
    return list(dict.fromkeys(cut))


def _plain(value: Any) -> Any:
    """Nested Mappings and sequences as plain dicts and lists (e.g. from an OmegaConf config)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value
