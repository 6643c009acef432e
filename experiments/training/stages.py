"""A job's training: its curriculum's stages in order on one model, one optimizer state and one
learning-rate schedule (a later length continues the run), then a recall mixture's other
points evaluated on the trained model. Returns the record's training columns; the stages
before the last, and the mixture's points, go to `on_stage` as they end.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from experiments.training import curriculum, progress
from experiments.training.precision import Precision
from experiments.training.tasks import Task, build_task
from experiments.training.train import (
    TrainingRun,
    TrainResult,
    evaluate,
    start_run,
    train,
    validation_points,
)

OnStep = Callable[[dict[str, Any], int], None]
OnStage = Callable[[curriculum.Stage, dict[str, Any]], None]


@dataclass
class Trained:
    """What training left for the measurements after it: the last stage's result, the run
    (optimizer state, steps to learn) and the steps taken over every stage."""

    result: TrainResult | None
    run: TrainingRun
    steps: int


def train_stages(
    job,
    model: nn.Module,
    task: Task,
    device: torch.device,
    precision: Precision,
    *,
    before: dict[str, Any],
    on_step: OnStep | None = None,
    on_stage: OnStage | None = None,
) -> tuple[dict[str, Any], Trained]:
    """Train `model` through `job.stages` (`job`: an `experiments.job_config.JobConfig`; the
    last stage's task is `task`, the others built at their length). Returns the last stage's
    training columns and `Trained`. `on_step(metrics, step)` gets every step (counted across
    stages); `on_stage(stage, columns)` the columns of each stage before the last, as soon as
    it ends, on top of `before` (the columns measured so far)."""
    stages = job.stages
    run = start_run(model, job.train, sum(stage.steps for stage in stages), precision)
    trained_steps, result, columns = 0, None, {}
    bar = progress.TrainingBar(
        sum(stage.steps for stage in stages),
        f"{job.attention['name']} L={job.seq_len}",
        on=progress.enabled(job.train.progress),
    )
    for number, stage in enumerate(stages):
        if stage.steps == 0:
            continue
        last = number == len(stages) - 1
        stage_task = (
            task
            if last
            else build_task(
                job.task, seq_len=stage.seq_len, batch_size=stage.batch_size, seed=job.seed
            )
        )
        result = train(
            model,
            stage_task,
            device,
            dataclasses.replace(job.train, steps=stage.steps),
            on_step=_after(on_step, bar, trained_steps, stage.seq_len if len(stages) > 1 else None),
            precision=precision,
            run=run,
        )
        bar.skip(stage.steps - result.steps)  # a stage stopped early (train.stop_accuracy ...)
        trained_steps += result.steps
        trained = training_columns(result, stage_task, run)
        trained["trained_steps"] = trained_steps
        if len(stages) > 1:
            trained["curriculum_stage"] = number
        if last:
            columns = trained
        elif on_stage is not None:
            on_stage(stage, {**before, **trained})
    bar.close()
    return columns, Trained(result, run, trained_steps)


def mixture_points(
    job, model: nn.Module, task: Task, device, precision: Precision, trained: Trained
) -> Iterator[tuple[curriculum.Stage, dict[str, Any]]]:
    """A recall mixture's evaluation points: for each count of `task.train_pairs` but the job's
    own `n_pairs` (its record), the trained model's training columns with the evaluation at that
    count, as a 0-step `curriculum.Stage` whose task options say the count (so the record is
    the job's config at that n_pairs). Nothing for other tasks."""
    counts = getattr(task, "train_pairs", None) or ()
    result = trained.result
    # The last validation at each point, in `validation_points`' order (the job's count first).
    points = [p.n_pairs for p in validation_points(task)] if counts else []
    valid = dict(zip(points, result.valid or [], strict=False))  # none if it never trained
    for count in counts:
        if count == task.n_pairs:
            continue
        at_count = task.at_pairs(count)
        final = evaluate(
            model, at_count, device, job.train.eval_batches, precision,
            min_pairs=job.train.eval_pairs,
        )  # fmt: skip
        at = dataclasses.replace(
            result,
            eval_loss=final.loss,
            eval_accuracy=final.accuracy,
            final_eval=final,
            valid=[valid[count]] if count in valid else None,
        )
        point = curriculum.Stage(job.seq_len, job.batch_size, 0, task=(("n_pairs", count),))
        yield point, training_columns(at, at_count, trained.run)


def training_columns(result: TrainResult, task: Task, run: TrainingRun) -> dict[str, Any]:
    """The record's columns of one training result on `task`: losses, accuracy and its
    interval, validation (where held out), learned, bits per byte."""
    columns = {
        "train_loss": result.train_loss,
        "eval_loss": result.eval_loss,
        "eval_accuracy": result.eval_accuracy,
        "tokens_per_s": result.tokens_per_s,
        "train_stop": result.stop,
    }
    # The last validation at this record's point (what a grid chooses on), recorded only where
    # it is held out from what is reported (a byte task without `valid_fraction` validates on
    # its eval split).
    if result.valid and getattr(task, "validation_split", "valid") != "eval":
        columns["valid_loss"] = result.valid[0].loss
        if task.has_accuracy:
            columns["valid_accuracy"] = result.valid[0].accuracy
    if result.grad_warning is not None:  # float16 gradients that underflowed or overflowed
        columns["grad_warning"] = result.grad_warning
    if task.has_accuracy:
        # Learned so far: the job's own (last) record says it for the whole run.
        columns.update(learned=run.steps_to_learn is not None, steps_to_learn=run.steps_to_learn)
    final = result.final_eval
    if final is not None and final.floor_accuracy is not None:
        low, high = final.accuracy_ci
        columns.update(
            chance_accuracy=task.chance_accuracy,
            floor_accuracy=final.floor_accuracy,
            eval_accuracy_ci_low=low,
            eval_accuracy_ci_high=high,
            eval_distinct_pairs=final.distinct_pairs,
        )
    if task.reports_bits_per_byte:
        columns["eval_bits_per_byte"] = result.eval_loss / math.log(2)
    return columns


def _after(on_step, bar: progress.TrainingBar, offset: int, seq_len: int | None):
    """on_step with steps counted from `offset` and, in a curriculum, the stage's length; each
    step also advances the progress bar."""

    def shifted(metrics: dict[str, Any], step: int) -> None:
        if seq_len is not None:
            metrics = {**metrics, "train/seq_len": seq_len}
        bar.advance(metrics)
        if on_step is not None:
            on_step(metrics, offset + step)

    return shifted
