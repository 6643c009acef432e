"""The local results store: one `result.json` per job, gathered per sweep into CSV and Parquet.

Layout of a sweep dir (Hydra's `hydra.sweep.dir`):
    <sweep>/<job num>/result.json   one record per job, written atomically by the job
    <sweep>/results.csv             every record of the sweep, one row per configuration
    <sweep>/results.parquet         the same, typed
A configuration is identified by `config_hash`; if it was measured more than once (a re-run of a
failed job), the newest record wins, so no configuration appears twice.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("attnbench")

SUMMARY_COLUMNS = (
    "attention",
    "block",
    "seq_len",
    "depth",
    "status",
    "attn_fwd_ms",
    "attn_fwd_bwd_ms",
    "step_ms",
    "peak_memory_bytes",
    "approx_rel_error",
    "train_loss",
    "eval_loss",
)


def iter_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every readable `result.json` below `sweep_dir` (unreadable ones are reported, not fatal)."""
    records = []
    for path in sorted(Path(sweep_dir).glob("**/result.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as error:
            log.warning("unreadable record %s: %s", path, error)
    return records


def find_ok_record(sweep_dir: Path, config_hash: str) -> Path | None:
    """The path of a status-ok record of `config_hash` in `sweep_dir`, if there is one."""
    for path in Path(sweep_dir).glob("**/result.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if rec.get("config_hash") == config_hash and rec.get("status") == "ok":
            return path
    return None


def gather(sweep_dir: Path) -> pd.DataFrame:
    """All records of a sweep as a DataFrame, one row per configuration (newest record wins)."""
    frame = pd.DataFrame(iter_records(sweep_dir))
    if frame.empty:
        return frame
    frame = frame.sort_values("timestamp").drop_duplicates("config_hash", keep="last")
    return frame.sort_values(["attention", "block", "seq_len"]).reset_index(drop=True)


def write_results(sweep_dir: Path) -> pd.DataFrame:
    """Gather a sweep into `results.csv` and `results.parquet` in `sweep_dir`; returns the frame."""
    sweep_dir = Path(sweep_dir)
    frame = gather(sweep_dir)
    if frame.empty:
        log.warning("no records found in %s", sweep_dir)
        return frame
    frame.to_csv(sweep_dir / "results.csv", index=False)
    # Parquet wants one type per column; config columns can mix (e.g. stride 'auto' or 64).
    typed = frame.copy()
    for column in typed.columns:
        if typed[column].dtype == object:
            typed[column] = typed[column].map(_text_or_none)
    typed.to_parquet(sweep_dir / "results.parquet", index=False)
    return frame


def _text_or_none(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, str) else str(value)


def format_records(records: list[dict[str, Any]] | pd.DataFrame) -> str:
    """A compact text table of the headline columns."""
    frame = pd.DataFrame(records)
    columns = [c for c in SUMMARY_COLUMNS if c in frame.columns]
    frame = frame[columns].copy()
    if "peak_memory_bytes" in frame:
        frame["peak_memory_bytes"] = frame["peak_memory_bytes"].map(
            lambda b: f"{b / 2**20:.1f} MiB" if pd.notna(b) else ""
        )
        frame = frame.rename(columns={"peak_memory_bytes": "peak_memory"})
    return frame.to_string(index=False, float_format=lambda x: f"{x:.4g}")


class GatherResults(Callback):
    """Hydra callback: at the end of a multirun, gather the sweep's records into the store."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        frame = write_results(sweep_dir)
        if frame.empty:
            return
        print(format_records(frame))
        counts = frame["status"].value_counts().to_dict()
        print(f"{len(frame)} configurations {counts}; results: {sweep_dir / 'results.csv'}")
