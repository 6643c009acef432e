"""A sign of life on a job's training: a bar over its steps, in a terminal only by default.

`TrainingBar`: a tqdm bar on stderr over every training step of a job (all the stages of a
curriculum: one bar), with the loss, the stage's length and the ETA. It is on by default in a
terminal and quiet when the output is not one (CI, log files, `make test`); `train.progress=
true|false` overrides either way (`enabled`), for this bar and for the sweep's line per job
(experiments/app/sweep_clock.py).
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def enabled(setting: bool | None) -> bool:
    """`train.progress`: True or False as given; None (the default) = stderr is a terminal."""
    if setting is None:
        return sys.stderr.isatty()
    return bool(setting)


class TrainingBar:
    """A bar over `total` training steps, or nothing when not `on`; `advance(metrics)` per step."""

    def __init__(self, total: int, description: str, *, on: bool):
        self._bar = (
            tqdm(total=total, desc=description, unit="step", file=sys.stderr, dynamic_ncols=True)
            if on and total > 0
            else None
        )

    def advance(self, metrics: dict[str, Any]) -> None:
        """One step done; shows its loss (and, in a curriculum, the stage's length)."""
        if self._bar is None:
            return
        shown = {"loss": f"{metrics['train/loss']:.3f}"}
        if "train/seq_len" in metrics:
            shown["L"] = metrics["train/seq_len"]
        if metrics.get("eval/accuracy") is not None:
            shown["eval acc"] = f"{metrics['eval/accuracy']:.3f}"
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)

    def skip(self, steps: int) -> None:
        """`steps` of the total that will not run (a stage that stopped early)."""
        if self._bar is not None and steps > 0:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
