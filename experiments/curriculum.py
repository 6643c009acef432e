"""Training in stages of growing length: the schedule of `train.curriculum` and each stage's config.

A job trains at its `seq_len` for `train.steps` steps. With `train.curriculum` (a list of
`{seq_len, steps}`, lengths increasing and shorter than the job's), the same model first trains
at each of those lengths in turn, then at its own. Every stage sees the same number of tokens per
step as the job (batch_size x seq_len), so a stage at a quarter of the length trains on four
times the sequences. Recall tasks are learned through a sudden transition after many steps at
short lengths and carry over to longer ones within a few hundred steps; a curriculum with the
same schedule for every variant is a fair way to reach long lengths in budget (and what a job
reports at each stage is how far a model trained that way gets at that length).

The stages are one training run: one optimizer state and one learning-rate schedule over all
of them (experiments/train.py, `TrainingRun`), so a later length continues, not restarts, and
every stage's record says how many steps the model had trained (`trained_steps`).

A job shorter than some of the curriculum's stages (a preset run at a shorter `seq_len`) takes
the stages below its length and leaves the others out; `skipped_note` says so in one line.

Each stage before the last is recorded as a configuration of its own: the job's config with
that stage's `seq_len` and `batch_size` (`stage_config`), so the results hold one row per
(variant, length) whatever the schedule.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from variants.checks import require_non_negative_int, require_positive_int

if TYPE_CHECKING:
    from experiments.config import JobConfig


@dataclass(frozen=True)
class Stage:
    """One stage: `steps` optimiser steps on sequences of `seq_len`, `batch_size` at a time.

    `task`: task options a record differs in from its job's, as (option, value) pairs: an
    evaluation point of a recall mixture (the trained model at one `n_pairs`, 0 steps of its
    own; experiments/measure.py), recorded the way a stage is.
    """

    seq_len: int
    batch_size: int
    steps: int
    task: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """Its record's name below the job: the length, or the task options (`n_pairs=4`)."""
        return ",".join(f"{option}={value}" for option, value in self.task) or str(self.seq_len)


def stages_of(job: JobConfig) -> list[Stage]:
    """The curriculum's stages, then the job's own (always last); `ValueError` on a bad entry.

    Stage batch sizes keep the job's tokens per step: batch_size * seq_len // stage seq_len
    (at least 1).
    """
    seq_len, batch_size = job.seq_len, job.batch_size
    tokens_per_step = seq_len * batch_size
    entries = job.train.curriculum or []
    if not isinstance(entries, (list, tuple)):
        raise ValueError(
            f"config: option 'train.curriculum' must be a list of {{seq_len, steps}}, "
            f"got {entries!r}"
        )
    stages, previous = [], 0
    for i, entry in enumerate(_below(entries, seq_len)):
        key = f"train.curriculum[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"seq_len", "steps"}:
            raise ValueError(
                f"config: option {key!r} must be {{seq_len: <int>, steps: <int>}}, got {entry!r}"
            )
        length = require_positive_int("config", f"{key}.seq_len", entry["seq_len"])
        steps = require_non_negative_int("config", f"{key}.steps", entry["steps"])
        if not previous < length < seq_len:
            raise ValueError(
                f"config: option '{key}.seq_len'={length} must be longer than the stage before "
                f"({previous}) and shorter than 'seq_len'={seq_len}"
            )
        stages.append(Stage(length, max(1, tokens_per_step // length), steps))
        previous = length
    stages.append(Stage(seq_len, batch_size, job.train.steps))
    return stages


def _below(entries, seq_len: int) -> list[Any]:
    """The entries up to the first one not shorter than the job (those after it are longer)."""
    kept = []
    for entry in entries:
        length = entry.get("seq_len") if isinstance(entry, dict) else None
        if isinstance(length, int) and length >= seq_len:
            break
        kept.append(entry)
    return kept


def skipped_note(job: JobConfig) -> str | None:
    """One line naming the curriculum stages a shorter job leaves out, None if it keeps all."""
    entries = list(job.train.curriculum or [])
    kept = _below(entries, job.seq_len)
    if len(kept) == len(entries):
        return None
    left_out = ", ".join(str(entry.get("seq_len")) for entry in entries[len(kept) :])
    trained = " -> ".join(str(stage.seq_len) for stage in job.stages)
    return (
        f"train.curriculum: stages at seq_len {left_out} are not shorter than seq_len="
        f"{job.seq_len} and are left out; training {trained}"
    )


def stage_config(config: dict[str, Any], stage: Stage) -> dict[str, Any]:
    """The job's config as a record of `stage` sees it: its seq_len, batch_size and task options."""
    staged = copy.deepcopy(config)
    staged["seq_len"], staged["batch_size"] = stage.seq_len, stage.batch_size
    staged["task"] = {**staged["task"], **dict(stage.task)}
    return staged
