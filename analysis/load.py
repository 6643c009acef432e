"""Sweep results -> one tidy DataFrame, one row per measured configuration (one job's record).

Sources, which all give the same columns: a sweep dir (its `<job>/result.json` records, per
`config_hash` the newest ok record, else the newest, as `experiments.records.store.gather`
does; `record_notes` says which; or, with none, its results.parquet / results.csv); a results
file (`results.csv`, `results.parquet` or one `result.json`); a W&B project online
(`load_wandb`). W&B's offline run folders are never read.

The frame has every record column in the schema's type (experiments/records/record.py), plus
`variant` (the attention name and the options that differ between that attention's rows, e.g.
"lsh n_hashes=2 bucket_size=64"), `source`, `history_path` and `wandb_path`. Per-step training
curves: `load_curves(frame)`.

The frame's schema column by column: docs/internals-analysis.md, "load".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.records import history, record, store
from experiments.records.values import bool_or_none, text_or_none

log = logging.getLogger("attnbench")

# The columns every frame has, from the record schema (experiments/records/record.py).
IDENTITY = record.names(record.IDENTITY)
CONFIG = record.names(record.CONFIG)
MEASUREMENTS = record.names(record.MEASURED, optional=False)  # float, NaN when not measured
PROVENANCE = record.names(record.PROVENANCE)
ADDED = ("variant", "source", "history_path", "wandb_path")
CURVE_METRICS = ("train/loss", "eval/loss", "eval/accuracy")
SUMMARY_JOB_TYPE = "sweep-summary"  # the sweep's summary run (tracking.log_sweep_summary)
_SORT = ("sweep", "attention", "variant", "block", "depth", "seq_len", "seed")


def load_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Records from sweep dirs or results files (see the module doc), as one tidy frame.

    Raises FileNotFoundError for a path holding no results.
    """
    frames = [_load_path(Path(p)) for p in paths]
    return tidy(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())


def unreadable_records(paths: Iterable[str | Path]) -> list[store.Unreadable]:
    """The `result.json` files below the sweep dirs among `paths` that could not be read."""
    return [bad for p in paths if Path(p).is_dir() for bad in store.read_records(Path(p))[1]]


def record_notes(paths: Iterable[str | Path]) -> list[str]:
    """Warnings and notes on the records below the sweep dirs among `paths` that are shown:
    ok records holding NaN, an ok record shown over a newer failure, older ok records kept
    (`experiments.records.store.shown_notes`)."""
    notes = []
    for path in (Path(p) for p in paths):
        if path.is_dir():
            found = store.scan(path)
            notes += [f"warning: {w}" for w in found.warnings]
            notes += [f"note: {n}" for n in store.shown_notes(found)]
    return notes


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
        and k != history.STEP_AXIS
        and not k.startswith("_")
        and not isinstance(v, (dict, list))
    }


def load_curves(frame: pd.DataFrame, metrics: Iterable[str] = CURVE_METRICS) -> pd.DataFrame:
    """Per-step training metrics of the frame's rows, long format: row, step, metric, value.

    `row` is the frame's index label. A row's curve comes from its history file
    (`history_path`, whatever the logger was), else from its online W&B run (`wandb_path`);
    rows with neither (no training, or a results file copied without its job dirs) have none.
    A history file that cannot be read (damaged) is named in one warning and its row has none.
    The result is empty when no row has one.
    """
    metrics = tuple(metrics)
    points = []
    for row, path, wandb_path in zip(
        frame.index, frame["history_path"], frame["wandb_path"], strict=True
    ):
        if isinstance(path, str):
            try:
                steps = history.read(Path(path))
            except (OSError, ValueError, KeyError) as error:  # pyarrow's ArrowInvalid: damaged
                reason = " ".join(f"{type(error).__name__}: {error}".split())[:200]
                log.warning("unreadable history %s (%s); its curve is left out", path, reason)
                continue
            steps = steps[steps["metric"].isin(metrics)]
            points += [(row, int(s), m, float(v)) for s, m, v in steps.itertuples(index=False)]
            continue
        if not isinstance(wandb_path, str):
            continue
        for entry in _online_history(wandb_path, metrics):
            step = entry.get(history.STEP_AXIS)
            for metric in metrics:
                value = entry.get(metric)
                if step is not None and record.is_number(value):
                    points.append((row, int(step), metric, float(value)))
    return pd.DataFrame(points, columns=["row", "step", "metric", "value"])


def tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """Typed columns, every schema column present, a `variant` label, a stable row order.

    Each column the record schema knows gets its type whatever the source (a measurement is
    float with NaN when not measured, a config int is int when every record has it, a bool is
    True/False/None, text is str/None); see `_typed`.
    """
    frame = _state_bytes_of_old_records(_gaussian_error_of_old_records(frame.copy()))
    schema = (*IDENTITY, *CONFIG, *PROVENANCE, *ADDED[1:], *MEASUREMENTS)
    missing = [c for c in dict.fromkeys(schema) if c not in frame]
    frame = pd.concat([frame, pd.DataFrame(None, index=frame.index, columns=missing)], axis=1)
    for name in frame.columns:
        frame[name] = _typed(name, frame[name])
    if "model.shared_qk" in frame:  # records from before `shared_qk` was resolved in them
        frame["shared_qk"] = frame["shared_qk"].where(
            frame["shared_qk"].notna(), _typed("shared_qk", frame["model.shared_qk"])
        )
    frame = _heads_of_old_records(frame)
    frame = _layers_of_old_records(frame)
    frame = _options_of_old_records(frame)
    frame = frame.copy()  # one block per dtype again after the column-by-column conversion
    frame["variant"] = variant_labels(frame)
    order = [c for c in _SORT if frame[c].notna().any()]
    frame = frame.sort_values(order, kind="stable", na_position="last") if order else frame
    return frame.reset_index(drop=True)


def _options_of_old_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Records written before an attention option existed (`attention.dt_min` in a Gated
    DeltaNet record of last week): the option's hash-neutral default (`HASH_NEUTRAL_DEFAULTS`:
    the default does what the code did before it), where another record of the same variant
    holds the option, so that old and new records of one configuration are one series."""
    for key, default in record.HASH_NEUTRAL_DEFAULTS.items():
        if not key.startswith("attention.") or key not in frame or default is None:
            continue
        owners = set(frame.loc[frame[key].notna(), "attention"].dropna().map(str))
        old = frame[key].isna() & frame["attention"].map(str).isin(owners)
        if old.any():
            frame[key] = frame[key].astype(object).where(~old, default)
            frame[key] = _typed(key, frame[key])
    return frame


def _heads_of_old_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Records written before `head_dim` and `n_kv_heads` were columns: d_model / n_heads and
    n_heads (they had no grouped KV heads), so that they are one series with newer records."""
    old = frame["head_dim"].isna() & frame["d_model"].notna() & frame["n_heads"].notna()
    if old.any():
        frame.loc[old, "head_dim"] = frame.loc[old, "d_model"] // frame.loc[old, "n_heads"]
    old = frame["n_kv_heads"].isna() & frame["n_heads"].notna()
    if "model.n_kv_heads" in frame:
        old &= frame["model.n_kv_heads"].isna()
    if old.any():
        frame.loc[old, "n_kv_heads"] = frame.loc[old, "n_heads"]
    for name in ("head_dim", "n_kv_heads"):
        frame[name] = _typed(name, frame[name])
    return frame


# What `decode_state_bytes` was called before it was the decoder's state (the same figure: the
# kernel's cache after the prefill).
OLD_STATE_BYTES = "cache_bytes"


def _state_bytes_of_old_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Records written before the decoder's state was `decode_state_bytes` hold it as
    `cache_bytes`: read as `decode_state_bytes`, so that one figure has one column."""
    if OLD_STATE_BYTES not in frame:
        return frame
    old = frame.pop(OLD_STATE_BYTES)
    new = "decode_state_bytes"
    frame[new] = (
        old if new not in frame else frame[new].astype(object).where(frame[new].notna(), old)
    )
    return frame


def _layers_of_old_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Records written before `layers` was a column (no `model.layers`: every layer ran the
    attention variant): their stack is their attention, as newer records of such stacks say."""
    old = frame["layers"].isna() & frame["attention"].notna()
    if "model.layers" in frame:
        old &= frame["model.layers"].isna()
    if old.any():
        frame["layers"] = frame["layers"].astype(object)
        frame.loc[old, "layers"] = frame.loc[old, "attention"]
    return frame


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
    """One source (see the module doc) with `source` and `history_path` set."""
    if path.is_file():
        frame, root = _load_file(path), path.parent
    elif not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    elif next(path.glob("**/result.json"), None) is not None:
        frame, root = store.gather(path), path
    elif (path / "results.parquet").exists():
        frame, root = pd.read_parquet(path / "results.parquet"), path
    elif (path / "results.csv").exists():
        frame, root = _read_csv(path / "results.csv"), path
    else:
        raise FileNotFoundError(f"{path}: no result.json, results.csv or results.parquet below it")
    # Joined, not inserted: a wide frame is fragmented, and inserting into it warns.
    extra = {"source": str(path), "history_path": _history_paths(frame, root)}
    return pd.concat([frame.drop(columns=list(extra), errors="ignore"),
                      pd.DataFrame(extra, index=frame.index)], axis=1)  # fmt: skip


def _load_file(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return _read_csv(path)
    if path.suffix == ".json":
        try:
            return pd.DataFrame([store.read_record(path)])
        except ValueError as error:  # not JSON, or not a record (an object)
            raise ValueError(f"{path}: unreadable record: {error}") from error
    raise ValueError(f"{path}: results files are .csv, .parquet or result.json")


def _read_csv(path: Path) -> pd.DataFrame:
    """A results.csv, its text columns read as text (a job "0", a hash of digits)."""
    text = {c.name: str for c in record.SCHEMA if c.type is str}
    return pd.read_csv(path, low_memory=False, dtype=text)


def _history_paths(frame: pd.DataFrame, root: Path) -> list[str | None]:
    """Each row's history file below `root`: the `history.parquet` beside the result.json of
    the same configuration and timestamp (so a configuration recorded twice gets the history of
    the record that was kept, and a moved sweep finds its files where they now are)."""
    if frame.empty or "config_hash" not in frame or "timestamp" not in frame:
        return [None] * len(frame)
    found = {}
    for path in root.glob(f"**/{history.FILE}"):
        try:
            rec = store.read_record(path.with_name("result.json"))
        except (OSError, ValueError):  # a history without its record is no row's
            continue
        found[rec.get("config_hash"), rec.get("timestamp")] = str(path)
    return [
        found.get((digest, stamp))
        for digest, stamp in zip(frame["config_hash"], frame["timestamp"], strict=True)
    ]


def _online_history(wandb_path: str, metrics: tuple[str, ...]) -> list[dict[str, Any]]:
    """Step rows of one online run, one metric at a time (W&B returns rows having all keys)."""
    import wandb

    run = wandb.Api().run(wandb_path)
    rows = []
    for metric in metrics:
        rows += run.history(keys=[metric], x_axis=history.STEP_AXIS, pandas=False)
    return rows


def _typed(name: str, values: pd.Series) -> pd.Series:
    """A column in the type the record schema gives it (`record.column`).

    Sources differ: JSON keeps types, CSV turns text into numbers where it can and writes
    booleans as text, and results.parquet written before the store kept types holds mixed
    columns as text. A column the schema does not know (a flattened config key such as
    `attention.stride`, which can mix 'auto' and numbers) keeps its values, except that text
    which reads wholly as numbers or booleans is read back as such (`_read_text`).
    """
    column = record.column(name)
    if column is None:
        return _read_text(values)
    if column.numeric:
        numbers = pd.to_numeric(values.map(_number_or_none).astype(object), errors="coerce")
        return numbers.astype(float) if column.part == record.MEASURED else numbers
    if column.type is bool:
        return values.map(partial(bool_or_none, read_back=True)).astype(object)
    return values.map(partial(text_or_none, read_back=True)).astype(object)


def _number_or_none(value: Any) -> float | int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return pd.to_numeric(value, errors="coerce")
    return value


def _read_text(values: pd.Series) -> pd.Series:
    """Text that reads wholly as numbers, or as True/False, as numbers or bools; any other
    column unchanged but for missing text values, which become None."""
    if not (values.dtype == object or pd.api.types.is_string_dtype(values)):
        return values
    values = values.astype(object).where(values.notna() & values.ne("nan"), None)
    present = values.dropna()
    if present.empty:
        return pd.Series(None, index=values.index, dtype=object)
    if not present.map(lambda v: isinstance(v, str)).all():
        return values
    if present.isin(("True", "False")).all():
        return values.map(lambda v: None if v is None else v == "True").astype(object)
    numbers = pd.to_numeric(present, errors="coerce")
    if numbers.notna().all():
        return pd.to_numeric(values, errors="coerce")
    return values
