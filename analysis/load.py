"""Sweep results -> one tidy DataFrame, one row per measured configuration (one job's record).

Sources, which all give the same columns:
  - a sweep dir: its `<job>/result.json` records (newest per `config_hash`, as the runner's
    `experiments.store.gather` does), or when it has none, its `results.parquet` / `results.csv`;
  - a results file: `results.csv`, `results.parquet` or one `result.json`;
  - W&B offline runs (`load_offline_runs`, or a dir holding only `offline-run-*` folders): the
    summary of each job's run is its record;
  - a W&B project online (`load_wandb`), through `wandb.Api()`.

Schema of the frame (one row per record):
  record columns  every column the runner writes (experiments/record.py, run.py, measure.py):
                  identity    sweep, job, config_hash, status (ok|oom|timeout|skipped|error|
                              diverged), error
                  config      attention, block, task, seq_len, batch_size, d_model, n_heads,
                              depth, causal, dtype, seed, shared_qk (model.shared_qk resolved),
                              and the flattened attention.*, block.*, task.*, model.*, train.*,
                              measure.*, budget.*
                  measured    MEASUREMENTS below: float, NaN when not measured (status != ok or
                              a measure.* switch off); always present as columns
                  provenance  git_commit, torch_version, device, device_name, threads, hostname,
                              timestamp, offline_run_dir (as recorded, maybe on another machine)
  variant         attention name plus the attention.* options that differ between that
                  attention's rows, e.g. "lsh n_hashes=2 bucket_size=64"; just "full" when none do
  source          the path (or W&B URL) the row was read from
  run_dir         the row's W&B offline run folder when it exists here (a moved sweep is searched
                  by the run folder's name), else None
  wandb_path      "entity/project/run_id" for rows read online, else None
Per-step training curves live only in W&B history: `load_curves(frame)` reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from experiments import record, store, tracking

MEASUREMENTS = (
    "attn_fwd_ms",
    "attn_fwd_iqr_ms",
    "attn_fwd_bwd_ms",
    "attn_fwd_bwd_iqr_ms",
    "step_ms",
    "step_iqr_ms",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "attn_fwd_flops",
    "attn_fwd_bwd_flops",
    "attn_fwd_gflops_per_s",
    "attn_fwd_bwd_gflops_per_s",
    "attn_fwd_bwd_matmul_fraction",
    "matmul_peak_gflops_per_s",
    "approx_rel_error",
    "approx_rel_error_gaussian",
    "approx_reference_bits_per_byte",
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "tokens_per_s",
    "n_parameters",
    "job_seconds",
    "curriculum_stage",
    "trained_steps",
)
IDENTITY = ("sweep", "job", "config_hash", "status", "error")
CONFIG = (*record.ALIASES, *record.RESOLVED)
PROVENANCE = (
    "git_commit",
    "torch_version",
    "device_name",
    "hostname",
    "timestamp",
    "offline_run_dir",
)
ADDED = ("variant", "source", "run_dir", "wandb_path")
CURVE_METRICS = ("train/loss", "eval/loss", "eval/accuracy")
SUMMARY_JOB_TYPE = "sweep-summary"  # the sweep's summary run (tracking.log_sweep_summary)
_SORT = ("sweep", "attention", "variant", "block", "depth", "seq_len", "seed")


def load_results(paths: Iterable[str | Path], *, offline_runs: bool = False) -> pd.DataFrame:
    """Records from sweep dirs or results files (see the module doc), as one tidy frame.

    `offline_runs=True` reads the W&B offline runs under each path instead of result.json files.
    Raises FileNotFoundError for a path holding no results.
    """
    frames = [load_offline_runs(p) if offline_runs else _load_path(Path(p)) for p in paths]
    return tidy(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


def unreadable_records(paths: Iterable[str | Path]) -> list[store.Unreadable]:
    """The `result.json` files below the sweep dirs among `paths` that could not be read."""
    return [bad for p in paths if Path(p).is_dir() for bad in store.read_records(Path(p))[1]]


def load_offline_runs(root: str | Path) -> pd.DataFrame:
    """One row per job run under `root` (every `offline-run-*`), from each run's summary.

    The sweep's own summary run is left out. As in the results store, a configuration recorded
    more than once in `root` (a resumed sweep) keeps its newest record.
    """
    rows = []
    for run_dir in tracking.find_offline_runs(Path(root)):
        run = tracking.read_offline_run(run_dir)
        if run["job_type"] == SUMMARY_JOB_TYPE or "status" not in run["summary"]:
            continue
        rows.append(
            {**summary_record(run["summary"]), "source": str(run_dir), "run_dir": str(run_dir)}
        )
    if not rows:
        raise FileNotFoundError(f"{root}: no W&B offline job runs")
    return _newest_per_config(pd.DataFrame(rows))


def load_wandb(project: str, group: str | None = None, *, api: Any = None) -> pd.DataFrame:
    """Records of the job runs of W&B `project` ("entity/project"), of one `group` (sweep) if set.

    Reads each run's summary through the public API (`api` defaults to `wandb.Api()`; needs a
    login). The result has the same columns as `load_results`.
    """
    if api is None:
        import wandb

        api = wandb.Api()
    rows = []
    for run in api.runs(project, filters={"group": group} if group else {}):
        summary = dict(run.summary_metrics)
        if run.job_type == SUMMARY_JOB_TYPE or "status" not in summary:
            continue
        rows.append(
            {**summary_record(summary), "source": run.url, "wandb_path": "/".join(run.path)}
        )
    if not rows:
        raise FileNotFoundError(f"W&B {project} group {group!r}: no job runs")
    return tidy(pd.DataFrame(rows))


def summary_record(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The record part of a W&B run summary.

    Step metrics (`train/loss`, ..., and the `step` axis) also land in the summary when logged;
    record columns never contain "/", so those are the keys to drop.
    """
    return {
        k: v
        for k, v in summary.items()
        if "/" not in k
        and k != tracking.STEP_AXIS
        and not k.startswith("_")
        and not isinstance(v, (dict, list))
    }


def load_curves(frame: pd.DataFrame, metrics: Iterable[str] = CURVE_METRICS) -> pd.DataFrame:
    """Per-step training metrics of the frame's rows, long format: row, step, metric, value.

    `row` is the frame's index label. Rows without a reachable W&B run (logger=none, or runs not
    copied with the results) have no curve; the result is empty when none has.
    """
    metrics = tuple(metrics)
    points = []
    for row, run_dir, wandb_path in zip(
        frame.index, frame["run_dir"], frame["wandb_path"], strict=True
    ):
        if isinstance(run_dir, str):
            history = tracking.read_offline_run(Path(run_dir))["history"]
        elif isinstance(wandb_path, str):
            history = _online_history(wandb_path, metrics)
        else:
            continue
        for entry in history:
            step = entry.get(tracking.STEP_AXIS)
            for metric in metrics:
                value = entry.get(metric)
                if step is not None and _is_number(value):
                    points.append((row, int(step), metric, float(value)))
    return pd.DataFrame(points, columns=["row", "step", "metric", "value"])


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed columns, every schema column present, a `variant` label, a stable row order."""
    frame = _gaussian_error_of_old_records(frame.copy())
    schema = (*IDENTITY, *CONFIG, *PROVENANCE, *ADDED[1:], *MEASUREMENTS)
    missing = [c for c in dict.fromkeys(schema) if c not in frame]
    frame = pd.concat([frame, pd.DataFrame(None, index=frame.index, columns=missing)], axis=1)
    for column in MEASUREMENTS:
        values = frame[column] if column in frame else float("nan")
        frame[column] = pd.to_numeric(values, errors="coerce")
        frame[column] = frame[column].astype(float)
    for column in frame.columns:
        if column not in MEASUREMENTS:
            frame[column] = _coerce(frame[column])
    if "model.shared_qk" in frame:  # records from before `shared_qk` was resolved in them
        frame["shared_qk"] = frame["shared_qk"].where(
            frame["shared_qk"].notna(), frame["model.shared_qk"]
        )
    frame = frame.copy()  # one block per dtype again after the column-by-column conversion
    frame["variant"] = variant_labels(frame)
    order = [c for c in _SORT if frame[c].notna().any()]
    frame = frame.sort_values(order, kind="stable", na_position="last") if order else frame
    return frame.reset_index(drop=True)


def _gaussian_error_of_old_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Records written before the error was measured on trained activations (no
    `approx_reference_digest`) measured `approx_rel_error` on N(0, 1) inputs: that figure is
    their `approx_rel_error_gaussian`, and they have no trained-activation error."""
    if "approx_rel_error" not in frame:
        return frame
    digest = frame.get("approx_reference_digest", pd.Series(None, index=frame.index))
    old = digest.isna() & frame["approx_rel_error"].notna()
    if old.any():
        if "approx_rel_error_gaussian" not in frame:
            frame["approx_rel_error_gaussian"] = None
        frame["approx_rel_error_gaussian"] = frame["approx_rel_error_gaussian"].astype(object)
        frame.loc[old, "approx_rel_error_gaussian"] = frame.loc[old, "approx_rel_error"]
        frame["approx_rel_error"] = frame["approx_rel_error"].astype(object)
        frame.loc[old, "approx_rel_error"] = None
    return frame


def variant_labels(frame: pd.DataFrame) -> pd.Series:
    """Attention name plus each attention.* option that differs between that attention's rows."""
    options = [c for c in frame.columns if c.startswith("attention.") and c != "attention.name"]
    labels = frame["attention"].map(format_value).astype(object)
    for name, rows in frame.groupby("attention", sort=False):
        varying = [c for c in options if rows[c].map(format_value).nunique() > 1]
        for index, row in rows[varying].iterrows() if varying else ():
            knobs = (f"{c.split('.', 1)[1]}={format_value(row[c])}" for c in varying)
            labels[index] = " ".join([str(name), *knobs])
    return labels


def format_value(value: Any) -> str:
    """A config value as a short label: 64.0 -> "64", None/NaN -> "none"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _load_path(path: Path) -> pd.DataFrame:
    """One source (see the module doc) with `source` and `run_dir` set."""
    if path.is_file():
        frame, root = _load_file(path), path.parent
    elif not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    elif next(path.glob("**/result.json"), None) is not None:
        frame, root = store.gather(path), path
    elif (path / "results.parquet").exists():
        frame, root = pd.read_parquet(path / "results.parquet"), path
    elif (path / "results.csv").exists():
        frame, root = pd.read_csv(path / "results.csv", low_memory=False), path
    elif tracking.find_offline_runs(path):
        return load_offline_runs(path)
    else:
        raise FileNotFoundError(
            f"{path}: no result.json, results.csv, results.parquet or W&B offline run below it"
        )
    frame["source"] = str(path)
    frame["run_dir"] = _locate_runs(frame.get("offline_run_dir"), root)
    return frame


def _load_file(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path, low_memory=False)
    if path.suffix == ".json":
        return pd.DataFrame([json.loads(path.read_text())])
    raise ValueError(f"{path}: results files are .csv, .parquet or result.json")


def _locate_runs(recorded: pd.Series | None, root: Path) -> list[str | None]:
    """Each recorded offline run dir if it exists, else the run folder of that name under root."""
    if recorded is None:
        return []
    moved = None
    located = []
    for value in recorded:
        if not isinstance(value, str) or not value:
            located.append(None)
        elif Path(value).is_dir():
            located.append(value)
        else:
            if moved is None:  # search once, only when a sweep was moved
                moved = {p.name: str(p) for p in tracking.find_offline_runs(root)}
            located.append(moved.get(Path(value).name))
    return located


def _newest_per_config(frame: pd.DataFrame) -> pd.DataFrame:
    """As `experiments.store.gather`: a configuration recorded twice keeps its newest record."""
    if "timestamp" in frame and "config_hash" in frame:
        frame = frame.sort_values("timestamp").drop_duplicates("config_hash", keep="last")
    return frame.reset_index(drop=True)


def _online_history(wandb_path: str, metrics: tuple[str, ...]) -> list[dict[str, Any]]:
    """Step rows of one online run, one metric at a time (W&B returns rows having all keys)."""
    import wandb

    run = wandb.Api().run(wandb_path)
    rows = []
    for metric in metrics:
        rows += run.history(keys=[metric], x_axis=tracking.STEP_AXIS, pandas=False)
    return rows


def _coerce(column: pd.Series) -> pd.Series:
    """Numbers stored as text (CSV, Parquet's stringified mixed columns) back to numbers.

    A column becomes numeric only if every non-missing value is a number; "True"/"False" become
    booleans; missing values of text columns (also the text "nan") become None.
    """
    if not (column.dtype == object or pd.api.types.is_string_dtype(column)):
        return column
    # results.parquet from experiments.store stringifies a missing value of a mixed column.
    column = column.astype(object).where(column.ne("nan"), None)
    present = column.dropna()
    if present.empty:
        return pd.Series(None, index=column.index, dtype=object)
    if present.map(lambda v: isinstance(v, bool) or v in ("True", "False")).all():
        return column.map(
            lambda v: (
                v
                if v is None or isinstance(v, bool)
                else (v == "True" if isinstance(v, str) else None)
            )
        )
    numbers = pd.to_numeric(present, errors="coerce")
    if numbers.notna().all() and not present.map(lambda v: isinstance(v, bool)).any():
        return pd.to_numeric(column, errors="coerce")
    return column.astype(object).where(column.notna(), None)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
