"""Training in stages of growing length: the schedule of `train.curriculum`.

A job trains at its `seq_len` for `train.steps` steps. With `train.curriculum` (a list of
`{seq_len, steps}`, lengths increasing and shorter than the job's), the same model first trains
at each of those lengths in turn, then at its own. Every stage sees the same number of tokens
per step as the job (batch_size x seq_len). The stages are one training run (one optimizer
state and one learning-rate schedule: experiments/training/train.py, `TrainingRun`), and every
stage's record says how many steps the model had trained (`trained_steps`). A job shorter than
some stages takes those below its length; `skipped_note` says so in one line.

`experiments.job_config.JobConfig` computes the job's `stages` when it is built, and
`JobConfig.at_stage(stage)` is the configuration each earlier stage is recorded as. This module
takes plain values and knows nothing of the config.

Why a curriculum, and how stages are recorded: docs/internals.md, "curriculum".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from variants.checks import require_non_negative_int, require_positive_int

OWNER = "config"


@dataclass(frozen=True)
class Stage:
    """One stage: `steps` optimiser steps on sequences of `seq_len`, `batch_size` at a time.

    `task`: task options a record differs in from its job's, as (option, value) pairs: an
    evaluation point of a recall mixture (the trained model at one `n_pairs`, 0 steps of its
    own; experiments/measurement/measure.py), recorded the way a stage is.
    """

    seq_len: int
    batch_size: int
    steps: int
    task: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """Its record's name below the job: the length, or the task options (`n_pairs=4`)."""
        return ",".join(f"{option}={value}" for option, value in self.task) or str(self.seq_len)


def stages(seq_len: int, batch_size: int, steps: int, entries: Any) -> list[Stage]:
    """The stages of `entries` (`train.curriculum`) below `seq_len`, then the job's own
    (`seq_len`, `batch_size`, `steps`; always last); `ValueError` naming a bad entry.

    Stage batch sizes keep the job's tokens per step: batch_size * seq_len // stage seq_len
    (at least 1).
    """
    tokens_per_step = seq_len * batch_size
    entries = entries or []
    if not isinstance(entries, (list, tuple)):
        raise ValueError(
            f"{OWNER}: option 'train.curriculum' must be a list of {{seq_len, steps}}, "
            f"got {entries!r}"
        )
    schedule, previous = [], 0
    for i, entry in enumerate(_below(entries, seq_len)):
        key = f"train.curriculum[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"seq_len", "steps"}:
            raise ValueError(
                f"{OWNER}: option {key!r} must be {{seq_len: <int>, steps: <int>}}, got {entry!r}"
            )
        length = require_positive_int(OWNER, f"{key}.seq_len", entry["seq_len"])
        stage_steps = require_non_negative_int(OWNER, f"{key}.steps", entry["steps"])
        if not previous < length < seq_len:
            raise ValueError(
                f"{OWNER}: option '{key}.seq_len'={length} must be longer than the stage before "
                f"({previous}) and shorter than 'seq_len'={seq_len}"
            )
        schedule.append(Stage(length, max(1, tokens_per_step // length), stage_steps))
        previous = length
    schedule.append(Stage(seq_len, batch_size, steps))
    return schedule


def _below(entries: Sequence[Any], seq_len: int) -> list[Any]:
    """The entries up to the first one not shorter than the job (those after it are longer)."""
    kept = []
    for entry in entries:
        length = entry.get("seq_len") if isinstance(entry, dict) else None
        if isinstance(length, int) and length >= seq_len:
            break
        kept.append(entry)
    return kept


def skipped_note(seq_len: int, entries: Any, schedule: Sequence[Stage]) -> str | None:
    """One line naming the entries of `train.curriculum` a job of `seq_len` leaves out (its
    `schedule`: `stages`), None if it keeps all."""
    entries = list(entries or [])
    kept = _below(entries, seq_len)
    if len(kept) == len(entries):
        return None
    left_out = ", ".join(str(entry.get("seq_len")) for entry in entries[len(kept) :])
    trained = " -> ".join(str(stage.seq_len) for stage in schedule)
    return (
        f"train.curriculum: stages at seq_len {left_out} are not shorter than seq_len="
        f"{seq_len} and are left out; training {trained}"
    )
