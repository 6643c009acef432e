"""The training loop every variant is trained with: AdamW, warmup then cosine, clipping, eval.

A curriculum is one training run: `TrainingRun` holds the one AdamW state and the one schedule
(warm-up once, cosine over the steps of every stage) that each stage's `train` call continues,
so a later length is never a restart. Recall tasks are also scored against their chance and
key-blind floor, with a 95 % interval, and the run remembers the first evaluation that reached
`LEARNED` accuracy (`steps_to_learn`).

Periodic evaluations read the task's validation split (`valid`: held out from training and from
the reported `eval` split), at every validation point (`validation_points`: the task, and each
other count of a recall mixture). They decide `steps_to_learn`, early stopping
(`train.stop_accuracy`, `train.patience`) and, in analysis, the learning rate chosen from a grid;
the numbers reported come from one last evaluation on the eval split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from experiments.training.precision import FLOAT32, Precision
from experiments.training.tasks import Batch, Task
from experiments.training.train_config import TrainConfig

# An evaluation at or above this accuracy, at any stage, means the job learned the task.
LEARNED = 0.9
# `train.patience`: an evaluation in which no validated point's accuracy (a task without
# accuracy: minus its loss, in nats) beats that point's best so far by this much is no progress.
PLATEAU_DELTA = 0.01
# Why a stage's training ended: its steps ran out, `train.stop_accuracy`, `train.patience`.
CAP, STOP_ACCURACY, PLATEAU = "cap", "accuracy", "plateau"
Z_95 = 1.959964  # the normal quantile of a two-sided 95 % interval


class Diverged(Exception):
    """The training or evaluation loss, or a float16 job's gradients, became NaN or infinite."""


@dataclass
class EvalResult:
    """Mean loss and accuracy over the scored positions; for recall tasks also the key-blind
    floor's accuracy on the same positions and the distinct (sequence, key) pairs answered."""

    loss: float
    accuracy: float
    floor_accuracy: float | None = None
    distinct_pairs: int | None = None

    def __iter__(self):
        """`loss, accuracy = evaluate(...)`."""
        return iter((self.loss, self.accuracy))

    @property
    def accuracy_ci(self) -> tuple[float, float] | None:
        """Wilson's 95 % score interval of the accuracy over the distinct pairs answered (a
        pair queried twice is not a second independent answer); None without pairs."""
        if not self.distinct_pairs:
            return None
        return wilson_interval(self.accuracy, self.distinct_pairs)


def wilson_interval(p: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (low, high) of a proportion `p` observed over `n` trials."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class TrainingRun:
    """One optimizer state and one learning-rate schedule over `total_steps`, shared by the
    `train` calls of a curriculum's stages; `step` counts the steps taken so far and
    `steps_to_learn` the step of the first evaluation at `LEARNED` accuracy (None: not yet)."""

    optimizer: torch.optim.Optimizer
    total_steps: int
    scaler: Any = None
    step: int = 0
    steps_to_learn: int | None = None


def start_run(
    model: nn.Module, settings: TrainConfig, total_steps: int, precision: Precision = FLOAT32
) -> TrainingRun:
    """A fresh AdamW on `model`'s parameters and a schedule over `total_steps`.

    The fused AdamW where every parameter is on a CPU or CUDA device (one kernel over all of
    them, not one per tensor): a Linformer step of the quality presets 60 -> 43 ms on one thread,
    no change for small models; the same update to float rounding."""
    parameters = list(model.parameters())
    fused = bool(parameters) and all(p.device.type in ("cpu", "cuda") for p in parameters)
    optimizer = torch.optim.AdamW(
        parameters, lr=settings.lr, weight_decay=settings.weight_decay, fused=fused or None
    )
    return TrainingRun(optimizer, total_steps, precision.grad_scaler())


@dataclass
class TrainResult:
    train_loss: float | None  # mean loss over the last eval window of training steps (nats/token)
    eval_loss: float | None
    eval_accuracy: float | None
    tokens_per_s: float | None  # training tokens per second of wall time, evaluation excluded
    steps: int  # steps taken: the cap, or fewer when `stop` ended the stage early
    grad_warning: str | None = None  # float16: steps whose gradients were all zero or overflowed
    final_eval: EvalResult | None = None  # the stage's last evaluation (at least eval_pairs)
    valid: list[EvalResult] | None = None  # the last validation, per `validation_points`
    stop: str = CAP  # why the stage ended: CAP, STOP_ACCURACY or PLATEAU


def validation_points(task: Task) -> list[Task]:
    """The tasks a run is validated on: `task`, then each other count of a recall mixture
    (`train_pairs`; the task `at_pairs` that count), so that stopping at an accuracy waits
    for the hardest count, not only the job's own."""
    counts = getattr(task, "train_pairs", None) or ()
    return [task, *(task.at_pairs(c) for c in counts if c != task.n_pairs)]


class Stopper:
    """`train.stop_accuracy` and `train.patience`, read at each validation: `check` returns
    why the stage should end (STOP_ACCURACY, PLATEAU) or None. Patience counts only once the
    task is learned (its own point at `LEARNED` accuracy; a task without accuracy: always):
    a run that has not learned goes on to its cap. Progress is read per validated point, so a
    mixture's hardest count still rising keeps the run going while the easy ones sit at their
    ceiling (a mean over the counts stopped DeltaNet's capacity run at 1550 of 3000 steps with
    64 pairs still climbing: 59.3 % there, 73.9 % at the cap)."""

    def __init__(self, settings: TrainConfig, has_accuracy: bool):
        self.stop_accuracy = settings.stop_accuracy if has_accuracy else None
        self.patience = settings.patience
        self.has_accuracy = has_accuracy
        self.best: list[float] | None = None  # per validated point
        self.stale = 0

    def check(self, results: list[EvalResult]) -> str | None:
        if self.stop_accuracy is not None and all(
            r.accuracy >= self.stop_accuracy for r in results
        ):
            return STOP_ACCURACY
        if self.patience is None:
            return None
        if self.has_accuracy and results[0].accuracy < LEARNED:
            # Not learned yet: recall is learned through a sudden jump after a long plateau
            # (routing: 19 % at step 500, 83 % at 550), so a plateau before it is no end.
            return None
        scores = [r.accuracy if self.has_accuracy else -r.loss for r in results]
        progress = self.best is None or any(
            score >= best + PLATEAU_DELTA for score, best in zip(scores, self.best, strict=True)
        )
        if self.best is None:
            self.best = scores
        elif progress:
            # A point's best moves only when it gains a full delta (as Keras's `min_delta`), so
            # slow gains add up: half a point per evaluation is progress every second one.
            self.best = [
                score if score >= best + PLATEAU_DELTA else best
                for score, best in zip(scores, self.best, strict=True)
            ]
        if progress:
            self.stale = 0
            return None
        self.stale += 1
        return PLATEAU if self.stale >= self.patience else None


class GradientCheck:
    """float16 gradients, checked every step: all zero (underflow: the step learns nothing) or
    non-finite. Non-finite gradients are a divergence unless a loss scaler whose scale is still
    above 1 produced them: it skips that step and lowers its scale, which is its job."""

    def __init__(self, scaler: torch.amp.GradScaler | None):
        self.scaler = scaler
        self.zero_steps: list[int] = []
        self.skipped_steps: list[int] = []

    def check(self, parameters, step: int) -> None:
        """After backward (and unscaling): note or raise `Diverged` on this step's gradients."""
        grads = [p.grad for p in parameters if p.grad is not None]
        largest = torch.stack([g.detach().abs().max().float() for g in grads]).max() if grads else 0
        largest = float(largest)
        if math.isfinite(largest):
            if largest == 0.0:
                self.zero_steps.append(step)
            return
        scale = None if self.scaler is None else float(self.scaler.get_scale())
        if scale is None or scale <= 1.0:
            raise Diverged(
                f"float16 gradients are {largest} at step {step}"
                + ("" if scale is None else f" (loss scale {scale:g})")
            )
        self.skipped_steps.append(step)

    def warning(self, steps: int) -> str | None:
        """One line naming what was seen over `steps` steps, or None if nothing was."""
        parts = []
        if self.zero_steps:
            parts.append(
                f"float16 gradients all zero (underflow) at {len(self.zero_steps)} of {steps} "
                f"steps, first at step {self.zero_steps[0]}"
            )
        if self.skipped_steps:
            parts.append(
                f"float16 gradients non-finite at {len(self.skipped_steps)} of {steps} steps "
                f"(skipped by the loss scaler), first at step {self.skipped_steps[0]}"
            )
        return "; ".join(parts) or None


def lr_at(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to 10 % of `lr` at `steps`."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def masked_loss_and_hits(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over `loss_mask` positions and the number of correct argmax predictions.

    logits: (B, L, V); returns (scalar loss, scalar int count of hits on masked positions).
    """
    mask = batch.loss_mask.reshape(-1)  # (B*L,)
    flat_logits = logits.reshape(-1, logits.shape[-1])[mask]  # (N, V)
    flat_targets = batch.targets.reshape(-1)[mask]  # (N,)
    loss = F.cross_entropy(flat_logits.float(), flat_targets)
    hits = (flat_logits.argmax(-1) == flat_targets).sum()
    return loss, hits


def training_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss a training step backpropagates: `masked_loss_and_hits`'s, or with
    `model.loss_chunks` > 1 the same loss from `TransformerLM.loss`, which never holds the
    (B, L, V) logits."""
    config = getattr(model, "config", None)
    if getattr(config, "loss_chunks", 1) > 1:
        return model.loss(batch.inputs, batch.targets, batch.loss_mask)
    return masked_loss_and_hits(model(batch.inputs), batch)[0]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    device: torch.device,
    n_batches: int,
    precision: Precision = FLOAT32,
    *,
    min_pairs: int = 0,
    split: str = "eval",
) -> EvalResult:
    """Mean loss and accuracy (over masked target positions) on `n_batches` batches of `split`,
    and on more until `min_pairs` distinct pairs were answered (recall tasks: those with
    `floor_hits` and `distinct_queries`, whose floor and pairs are then counted too)."""
    was_training = model.training
    model.eval()
    scored = hasattr(task, "floor_hits") and hasattr(task, "distinct_queries")
    total_loss, total_hits, total_count, floor_hits, pairs = 0.0, 0, 0, 0, 0
    index = 0
    while index < n_batches or (scored and pairs < min_pairs):
        batch = task.batch(split, index)
        if scored:
            floor_hits += task.floor_hits(batch)
            pairs += task.distinct_queries(batch)
        batch = batch.to(device)
        with precision.autocast():
            loss, hits = masked_loss_and_hits(model(batch.inputs), batch)
        count = int(batch.loss_mask.sum())
        total_loss += float(loss) * count
        total_hits += int(hits)
        total_count += count
        index += 1
    model.train(was_training)
    return EvalResult(
        total_loss / total_count,
        total_hits / total_count,
        floor_hits / total_count if scored else None,
        pairs if scored else None,
    )


def train(
    model: nn.Module,
    task: Task,
    device: torch.device,
    settings: TrainConfig,
    *,
    on_step: Callable[[dict[str, Any], int], None] | None = None,
    precision: Precision = FLOAT32,
    run: TrainingRun | None = None,
) -> TrainResult:
    """Train `model` for `settings.steps` optimiser steps on `task`; deterministic given the seeds.

    `run`: the training run to continue (a curriculum's optimizer and schedule, which this call
    advances by `settings.steps`); None starts one of exactly these steps. The last evaluation
    covers at least `settings.eval_pairs` distinct pairs of a recall task.

    `on_step(metrics, step)` receives `train/loss`, `train/lr` every step and `eval/loss`,
    `eval/accuracy` every `settings.eval_every` steps and at the end: the periodic evaluations,
    on the task's validation split (its `validation_split`) at the task's own point; the
    result's `eval_*` and `final_eval` are one more evaluation on the eval split, after the
    last step. `settings.stop_accuracy` and `settings.patience` may end the call before
    `settings.steps` (`Stopper`; the result's `steps` and `stop` say so). Raises `Diverged` on a
    NaN/inf training or evaluation loss, and in float16 on non-finite gradients (`GradientCheck`;
    all-zero ones are the result's `grad_warning`). Forward passes run under
    `precision.autocast()`; the parameters and AdamW's state stay in their own (float32) type,
    and float16 scales the loss (`experiments/training/precision.py`). `settings.curriculum` is the
    caller's (experiments/measurement/measure.py trains each stage with its own `steps`).
    """
    steps, lr, warmup = settings.steps, settings.lr, settings.warmup
    eval_every, eval_batches = settings.eval_every, settings.eval_batches
    run = run if run is not None else start_run(model, settings, steps, precision)
    optimizer, scaler, first = run.optimizer, run.scaler, run.step
    gradients = GradientCheck(scaler) if precision.name == "float16" else None
    points = validation_points(task)
    split = getattr(task, "validation_split", "eval")
    stopper = Stopper(settings, task.has_accuracy)
    model.train()
    recent: list[float] = []
    tokens, train_seconds, taken = 0, 0.0, 0
    valid: list[EvalResult] | None = None
    stop = CAP
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(first + step, lr=lr, warmup=warmup, steps=run.total_steps)
        batch = task.batch("train", step).to(device)
        started = time.perf_counter()
        with precision.autocast():
            loss = training_loss(model, batch)
        if not torch.isfinite(loss):
            raise Diverged(f"training loss is {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if gradients is not None:
            gradients.check(model.parameters(), step)
        if settings.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        loss_value = loss.item()  # synchronises on CUDA, so the timing below is honest
        train_seconds += time.perf_counter() - started
        tokens += batch.inputs.numel()
        taken += 1
        recent = (recent + [loss_value])[-max(1, eval_every or steps) :]
        metrics: dict[str, Any] = {
            "train/loss": loss_value,
            "train/lr": optimizer.param_groups[0]["lr"],
        }
        last = step == steps - 1
        run.step += 1
        if last or (eval_every and (step + 1) % eval_every == 0):
            valid = [
                evaluate(model, point, device, eval_batches, precision, split=split)
                for point in points
            ]
            own = valid[0]
            if not math.isfinite(own.loss):  # recorded as null, it would read "not measured"
                raise Diverged(f"eval_loss is {own.loss} after {step + 1} training steps")
            metrics.update({"eval/loss": own.loss, "eval/accuracy": own.accuracy})
            if task.has_accuracy and run.steps_to_learn is None and own.accuracy >= LEARNED:
                run.steps_to_learn = run.step
            stop = stopper.check(valid) or CAP
        if on_step is not None:
            on_step(metrics, step)
        if stop != CAP:
            break
    final_eval = eval_loss = eval_accuracy = None
    if taken:
        final_eval = evaluate(
            model, task, device, eval_batches, precision, min_pairs=settings.eval_pairs
        )
        eval_loss, eval_accuracy = final_eval.loss, final_eval.accuracy
        if not math.isfinite(eval_loss):
            raise Diverged(f"eval_loss is {eval_loss} after {taken} training steps")
    return TrainResult(
        train_loss=sum(recent) / len(recent) if recent else None,
        eval_loss=eval_loss,
        eval_accuracy=eval_accuracy if task.has_accuracy else None,
        tokens_per_s=tokens / train_seconds if train_seconds else None,
        steps=taken,
        grad_warning=None if gradients is None else gradients.warning(taken),
        final_eval=final_eval,
        valid=valid,
        stop=stop,
    )
