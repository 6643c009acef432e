"""What a training run is configured with: `TrainConfig`, the typed `train:` of the config.

It lives beside the training loop that reads it (train.py), so training imports nothing from the
floor above; the app builds it once per job (experiments/job_config.py `JobConfig.of`, which
re-exports it), checked on construction with a `ValueError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from variants.checks import require_non_negative_int, require_positive_int

OWNER = "config"  # errors name the config, as every check of the job's config does


@dataclass(frozen=True)
class TrainConfig:
    """AdamW steps with warmup then cosine decay, gradient clipping, evaluation every
    `eval_every` steps on `eval_batches` batches (a stage's last evaluation on more, until
    `eval_pairs` distinct pairs of a recall task were answered); `curriculum`: shorter stages first
    (experiments/training/curriculum.py); `progress`: a progress bar over the steps and a line per
    job of a sweep (None: when stderr is a terminal; experiments/training/progress.py).

    Train until learned: `steps` (a stage's `steps`) is the cap. `stop_accuracy` ends a stage at
    the first evaluation whose validation accuracy reaches it at every point the run is
    validated on; `patience` ends it, once the task is learned, after that many evaluations in
    a row without a new best (by `train.PLATEAU_DELTA`) mean validation accuracy: converged
    (None: never). A run that has not learned goes on to its cap."""

    steps: int
    lr: float
    warmup: int
    weight_decay: float
    grad_clip: float
    eval_every: int
    eval_batches: int
    curriculum: tuple[Any, ...] | list[Any] = ()
    progress: bool | None = None
    eval_pairs: int = 0
    stop_accuracy: float | None = None
    patience: int | None = None

    def __post_init__(self):
        for key in ("steps", "warmup", "eval_every", "eval_pairs"):
            require_non_negative_int(OWNER, f"train.{key}", getattr(self, key))
        require_positive_int(OWNER, "train.eval_batches", self.eval_batches)
        if self.patience is not None:
            require_positive_int(OWNER, "train.patience", self.patience)
        stop = self.stop_accuracy
        if stop is not None and (
            isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 < stop <= 1
        ):
            raise ValueError(
                f"{OWNER}: option 'train.stop_accuracy' must be a fraction in (0, 1] or null, "
                f"got {stop!r}"
            )
        if (stop is not None or self.patience is not None) and not self.eval_every:
            raise ValueError(
                f"{OWNER}: options 'train.stop_accuracy' and 'train.patience' need "
                "'train.eval_every' > 0 (they are read at the evaluations)"
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ValueError(
                f"{OWNER}: option 'train.progress' must be true, false or null, "
                f"got {self.progress!r}"
            )
