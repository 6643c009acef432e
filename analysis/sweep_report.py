"""A sweep's report and W&B summary at its end: both redone only when its records changed.

`update` draws `<sweep dir>/report/` (figures + report.md), then hands the records and figures
to the app, which logs the sweep's W&B summary run with them. It is the report step of the app's
end-of-sweep callback (experiments/app/sweep.py `SweepEnd`), named there by conf/config.yaml
(`hydra.callbacks.sweep_end.report_step`), so experiments imports nothing of analysis; the
step calls it after the store is gathered. A digest of every record and history file
of the sweep (`records_digest`) is kept beside the report, so re-running a fully recorded sweep
does not redraw an unchanged report (which takes longer than the resume itself).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.records import history

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("attnbench")

REPORT_DIR = "report"  # inside the sweep dir
DIGEST_FILE = ".records_digest"  # inside the report dir: `records_digest` of what it was drawn from


def records_digest(sweep_dir: Path, logger_cfg: Mapping[str, Any]) -> str:
    """A sha256 of every `result.json` and history file below `sweep_dir` (relative path and
    bytes) and of the logger settings: it changes when a record is added, changed, moved or
    removed, or when the summary would go to another W&B place."""
    digest = hashlib.sha256(json.dumps(logger_cfg, sort_keys=True, default=str).encode())
    files = [*sweep_dir.glob("**/result.json"), *sweep_dir.glob(f"**/{history.FILE}")]
    for path in sorted(files):
        digest.update(str(path.relative_to(sweep_dir)).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError as error:  # unreadable: listed in the report, as its own state
            digest.update(str(error).encode())
    return digest.hexdigest()


def update(
    sweep_dir: Path,
    logger_cfg: Mapping[str, Any],
    summarize: Callable[[pd.DataFrame, dict[str, Path]], None],
) -> None:
    """Write `<sweep dir>/report/` (figures + report.md), then `summarize(records, figures)`:
    the app logs the sweep's W&B summary run there, with `logger_cfg` (the resolved `logger`
    config), whose settings are part of what makes the report current.

    A failure to draw the report is logged with the command that redraws it and does not fail
    the finished sweep; the summary is still made, without figures. When the records and the
    logger settings are those the report was last drawn from (`DIGEST_FILE`), nothing is
    redone.
    """
    sweep_dir = Path(sweep_dir)
    out_dir = sweep_dir / REPORT_DIR
    digest = records_digest(sweep_dir, logger_cfg)
    if _drawn_from(out_dir) == digest:
        print(f"report: {out_dir / 'report.md'} (records unchanged since it was drawn)")
        return
    # Imported here, only when the report is drawn: the plotting stack (matplotlib) takes about
    # a second, which a no-op resume of an unchanged sweep does not need.
    from analysis import load, measured, report

    try:
        frame = load.load_results([sweep_dir])
    except FileNotFoundError as error:
        log.warning("no report: %s", error)
        return
    (out_dir / DIGEST_FILE).unlink(missing_ok=True)  # until this report is whole
    figures: dict[str, Path] = {}
    drawn = False
    try:
        figures = report.build_report(
            frame,
            out_dir,
            sources=[str(sweep_dir)],
            unreadable=load.unreadable_records([sweep_dir]),
            notes=load.record_notes([sweep_dir]),
        )
        print(f"report: {out_dir / 'report.md'}")
        drawn = True
        warned = measured.timing_warnings(frame)
        if warned is not None:
            print(f"warning: {len(warned.frame)} timing warning(s): see {out_dir / 'report.md'}")
    except Exception:  # the records are safe on disk; the report can be redrawn
        log.exception(
            "report failed; redraw it with: python -m analysis.report %s --out %s",
            sweep_dir,
            out_dir,
        )
    summarize(frame, figures)
    if drawn:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / DIGEST_FILE).write_text(digest + "\n")


def _drawn_from(out_dir: Path) -> str | None:
    """The digest of the records the report in `out_dir` was drawn from; None if there is no
    whole report there."""
    try:
        if (out_dir / "report.md").is_file():
            return (out_dir / DIGEST_FILE).read_text().strip()
    except OSError:
        pass
    return None
