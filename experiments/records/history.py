"""A job's per-step training curves, kept beside its record: `<dir of result.json>/history.parquet`.

Long format, one row per logged value:
    step    int     the training step, counted across a curriculum's stages
    metric  str     `train/loss`, `train/lr`, `eval/loss`, `eval/accuracy`, ... (a bare name
                    such as `loss` is a training metric: `train/loss`, as W&B gets it too)
    value   float   as logged; a diverged step's NaN is kept (readers skip non-finite values)
The file is what the report's training curves read (analysis/load.py `load_curves`), so they
exist with `logger=none` too and never depend on W&B's own file formats. It is written whole
(aside, then renamed) like the record, before the record, and moves wherever the record moves
(experiments/app/job.py); a curriculum stage's record gets the history up to the end of its stage.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.records import files

if TYPE_CHECKING:  # pandas is imported when a history is written or read, not for `--help`
    import pandas as pd

FILE = "history.parquet"  # beside result.json
COLUMNS = ("step", "metric", "value")
STEP_AXIS = "step"  # x-axis of per-step training curves (in W&B too)


def metric_name(key: str) -> str:
    """A step metric's full name: bare names are training metrics (`loss` -> `train/loss`)."""
    return key if "/" in key else f"train/{key}"


def beside(record_path: Path) -> Path:
    """The history file of the record at `record_path` (a result.json)."""
    return Path(record_path).with_name(FILE)


class History:
    """The steps of one job as they are trained: `log_step` is an `on_step` callback."""

    def __init__(self) -> None:
        self._rows: list[tuple[int, str, float]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def log_step(self, metrics: dict[str, Any], step: int) -> None:
        """Keep every numeric value of `metrics` at `step` (text and bools are not curves)."""
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._rows.append((int(step), metric_name(key), float(value)))

    def write(self, path: Path) -> None:
        """Write the steps so far to `path` whole (tmp file + rename); with no steps, remove
        `path` instead, so an older attempt's curve never stands beside this record."""
        import pandas as pd

        path = Path(path)
        if not self._rows:
            path.unlink(missing_ok=True)
            return
        frame = pd.DataFrame(self._rows, columns=list(COLUMNS))
        files.write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))


def read(path: Path) -> pd.DataFrame:
    """The history at `path` as a DataFrame (step, metric, value), non-finite values dropped."""
    import pandas as pd

    frame = pd.read_parquet(path, columns=list(COLUMNS))
    finite = frame["value"].map(lambda v: isinstance(v, float) and math.isfinite(v))
    return frame[finite].reset_index(drop=True)
