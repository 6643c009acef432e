"""Hydra callback: at the end of a multirun, build the sweep's report and log its W&B summary.

Registered in conf/config.yaml. Hydra calls `on_multirun_end` in reverse order of registration,
so listing it before `gather_results` makes it run after the results table is printed and
results.csv/.parquet are written (it reads the job records itself, so either order works):

    hydra:
      callbacks:
        sweep_report: {_target_: analysis.callbacks.SweepReport}
        gather_results: {_target_: experiments.store.GatherResults}
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from experiments import tracking

log = logging.getLogger("attnbench")

REPORT_DIR = "report"  # inside the sweep dir


class SweepReport(Callback):
    """Writes `<sweep dir>/report/` (figures + report.md), then the sweep's W&B summary run.

    A failure to draw the report is logged with the command that redraws it and does not fail
    the finished sweep; the summary run is still logged, without figures.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Imported here, not at the top: Hydra builds every callback when any run starts, and
        # the report's plotting stack (matplotlib) would add ~1 s to each single run's start.
        from analysis import load, report, tables

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            frame = load.load_results([sweep_dir])
        except FileNotFoundError as error:
            log.warning("no report: %s", error)
            return
        out_dir = sweep_dir / REPORT_DIR
        figures: dict[str, Path] = {}
        try:
            figures = report.build_report(
                frame,
                out_dir,
                sources=[str(sweep_dir)],
                unreadable=load.unreadable_records([sweep_dir]),
            )
            print(f"report: {out_dir / 'report.md'}")
            warned = tables.timing_warnings(frame)
            if warned is not None:
                print(
                    f"warning: {len(warned.frame)} timing warning(s): see {out_dir / 'report.md'}"
                )
        except Exception:  # the records are safe on disk; the report can be redrawn
            log.exception(
                "report failed; redraw it with: python -m analysis.report %s --out %s",
                sweep_dir,
                out_dir,
            )
        logger_cfg = OmegaConf.to_container(config.logger, resolve=True)
        run_dir = tracking.log_sweep_summary(
            logger_cfg,
            records=frame,
            figures=figures,
            group=str(config.sweep),
            out_dir=sweep_dir,
        )
        if run_dir is not None:
            print(f"W&B sweep summary run: {run_dir}")
