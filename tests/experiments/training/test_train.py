"""The training loop, on a task a two-layer model learns in a few dozen steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from experiments.training.tasks import Batch, generator
from experiments.training.train import (
    Diverged,
    GradientCheck,
    evaluate,
    lr_at,
    masked_loss_and_hits,
    train,
)
from experiments.training.train_config import TrainConfig

CPU = torch.device("cpu")
VOCAB = 8


class CopyTask:
    """Predict the current token (targets = inputs): a lookup table solves it exactly."""

    name = "copy"
    vocab_size = VOCAB
    has_accuracy = True

    def __init__(self, masked_first: int = 0):
        self.masked_first = masked_first  # positions before this one do not count

    def batch(self, split: str, index: int) -> Batch:
        tokens = torch.randint(VOCAB, (4, 16), generator=generator(0, split, index))  # (B, L)
        mask = torch.ones_like(tokens, dtype=torch.bool)
        mask[:, : self.masked_first] = False
        return Batch(tokens, tokens.clone(), mask)


def lookup_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))  # (B, L) -> (B, L, V)


class NaNFrom(nn.Module):
    """A lookup model whose logits become NaN from its `bad_call`-th training forward on."""

    def __init__(self, bad_call: int):
        super().__init__()
        self.inner, self.bad_call, self.calls = lookup_model(), bad_call, 0

    def forward(self, tokens):
        logits = self.inner(tokens)
        if self.training:
            self.calls += 1
            if self.calls > self.bad_call:
                return logits * float("nan")
        return logits


def fit(model, task=None, on_step=None, **overrides):
    options = dict(
        steps=40, lr=0.05, warmup=2, weight_decay=0.0, grad_clip=1.0, eval_every=10, eval_batches=2
    )
    settings = TrainConfig(**{**options, **overrides})
    return train(model, task or CopyTask(), CPU, settings, on_step=on_step)


def test_training_lowers_the_loss_on_a_learnable_task():
    losses = []
    result = fit(lookup_model(), on_step=lambda metrics, step: losses.append(metrics["train/loss"]))
    assert len(losses) == 40 and losses[0] > 1.5  # ~ln 8 at the start
    assert losses[-1] < 0.2 * losses[0]
    assert result.train_loss < 0.5 and result.eval_loss < 0.5 and result.eval_accuracy > 0.9
    assert result.steps == 40 and result.tokens_per_s > 0


def test_training_is_deterministic_given_the_seeds():
    first, second = fit(lookup_model(seed=3), steps=5), fit(lookup_model(seed=3), steps=5)
    assert (first.train_loss, first.eval_loss) == (second.train_loss, second.eval_loss)


def test_on_step_gets_train_metrics_every_step_and_eval_metrics_on_schedule():
    logged = []
    fit(lookup_model(), steps=5, eval_every=2, on_step=lambda m, s: logged.append((s, set(m))))
    assert [s for s, _ in logged] == [0, 1, 2, 3, 4]
    with_eval = [s for s, keys in logged if {"eval/loss", "eval/accuracy"} <= keys]
    assert with_eval == [1, 3, 4]  # every 2 steps, and at the end
    assert all({"train/loss", "train/lr"} <= keys for _, keys in logged)


def test_accuracy_is_none_for_a_task_without_one():
    class NoAccuracy(CopyTask):
        has_accuracy = False

    assert fit(lookup_model(), NoAccuracy(), steps=2).eval_accuracy is None


@pytest.mark.parametrize("bad_call", [0, 3])
def test_nan_loss_raises_diverged_at_its_step(bad_call):
    with pytest.raises(Diverged, match=f"at step {bad_call}"):
        fit(NaNFrom(bad_call), steps=10)


def test_absurd_learning_rate_diverges():
    with pytest.raises(Diverged):
        fit(lookup_model(), lr=1e9, warmup=0, weight_decay=0.01, steps=30)


class NaNInEval(nn.Module):
    """A lookup model that trains normally but whose evaluation logits are NaN."""

    def __init__(self):
        super().__init__()
        self.inner = lookup_model()

    def forward(self, tokens):
        logits = self.inner(tokens)
        return logits if self.training else logits * float("nan")


def test_a_non_finite_eval_loss_is_a_divergence_naming_it():
    """Scenario 4: `train.steps=1 train.lr=1e30` ended ok with eval_loss null (NaN recorded
    as "not measured"); only the training loss was checked."""
    with pytest.raises(Diverged, match=r"eval_loss is nan after 1 training steps"):
        fit(NaNInEval(), steps=1)


def _with_grads(*grads: torch.Tensor) -> list[nn.Parameter]:
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    return params


def test_float16_gradients_all_zero_are_warned_and_non_finite_ones_diverge():
    check = GradientCheck(scaler=None)
    check.check(_with_grads(torch.ones(3), torch.zeros(2)), step=0)
    check.check(_with_grads(torch.zeros(3), torch.zeros(2)), step=1)  # underflowed
    check.check(_with_grads(torch.zeros(3), torch.zeros(2)), step=2)
    assert check.warning(3) == (
        "float16 gradients all zero (underflow) at 2 of 3 steps, first at step 1"
    )
    with pytest.raises(Diverged, match="float16 gradients are inf at step 3"):
        check.check(_with_grads(torch.tensor([1.0, float("inf")])), step=3)
    with pytest.raises(Diverged, match="float16 gradients are nan at step 4"):
        check.check(_with_grads(torch.tensor([float("nan"), 1.0])), step=4)
    assert GradientCheck(scaler=None).warning(5) is None


def test_a_loss_scaler_above_1_skips_overflowed_steps_and_at_1_they_diverge():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    check = GradientCheck(scaler)
    check.check(_with_grads(torch.tensor([float("inf")])), step=0)  # the scaler skips it
    assert check.warning(4) == (
        "float16 gradients non-finite at 1 of 4 steps (skipped by the loss scaler), first at step 0"
    )
    low = GradientCheck(torch.amp.GradScaler("cpu", init_scale=1.0))
    with pytest.raises(Diverged, match=r"gradients are inf at step 2 \(loss scale 1\)"):
        low.check(_with_grads(torch.tensor([float("inf")])), step=2)


def test_loss_and_hits_count_only_masked_positions():
    batch = CopyTask(masked_first=10).batch("train", 0)
    logits = torch.randn(4, 16, VOCAB)
    logits[0, 12, batch.targets[0, 12]] = 100.0  # one sure hit among the counted positions
    loss, hits = masked_loss_and_hits(logits, batch)
    kept = logits[:, 10:].reshape(-1, VOCAB), batch.targets[:, 10:].reshape(-1)  # (N, V), (N,)
    assert loss == pytest.approx(float(F.cross_entropy(*kept)))
    assert int(hits) == int((kept[0].argmax(-1) == kept[1]).sum()) >= 1


def test_evaluate_restores_training_mode():
    model = lookup_model().train()
    loss, accuracy = evaluate(model, CopyTask(), CPU, n_batches=2)
    assert model.training and loss > 0 and 0 <= accuracy <= 1


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    rates = [lr_at(step, lr=1.0, warmup=4, steps=20) for step in range(20)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(rates[3:], rates[4:], strict=False))
    assert lr_at(20, lr=1.0, warmup=4, steps=20) == pytest.approx(0.1)
    assert lr_at(0, lr=2.0, warmup=0, steps=10) == 2.0
    assert all(math.isfinite(lr_at(s, lr=1.0, warmup=0, steps=1)) for s in range(3))


def test_one_run_carries_the_optimizer_and_the_schedule_across_calls():
    from experiments.training.train import start_run

    model = lookup_model()
    settings = TrainConfig(
        steps=5, lr=0.05, warmup=3, weight_decay=0.0, grad_clip=1.0, eval_every=0, eval_batches=1
    )
    run = start_run(model, settings, total_steps=10)
    lrs = []
    for _ in range(2):  # two stages of 5 steps: one AdamW, one warm-up, one cosine over 10
        train(
            model,
            CopyTask(),
            CPU,
            settings,
            run=run,
            on_step=lambda m, s: lrs.append(m["train/lr"]),
        )
    state = run.optimizer.state[next(model.parameters())]
    assert int(state["step"]) == 10 and run.step == 10  # AdamW's step count carried over
    assert lrs == pytest.approx([lr_at(s, lr=0.05, warmup=3, steps=10) for s in range(10)])
    assert lrs[5] < lrs[4]  # no second warm-up at the second call


def test_the_run_remembers_the_first_evaluation_at_ninety_percent():
    from experiments.training.train import start_run

    model = lookup_model()
    settings = TrainConfig(
        steps=40, lr=0.05, warmup=2, weight_decay=0.0, grad_clip=1.0, eval_every=10, eval_batches=2
    )
    run = start_run(model, settings, total_steps=40)
    accuracies = {}
    train(
        model,
        CopyTask(),
        CPU,
        settings,
        run=run,
        on_step=lambda m, s: accuracies.update(
            {s + 1: m["eval/accuracy"]} if "eval/accuracy" in m else {}
        ),
    )
    first = min(step for step, value in accuracies.items() if value >= 0.9)
    assert run.steps_to_learn == first


def test_wilson_interval_matches_a_hand_computed_value():
    from experiments.training.train import wilson_interval

    low, high = wilson_interval(
        0.5, 512
    )  # centre 0.5, half-width 1.96 * sqrt(.25 / 512) / (1 + z²/n)
    assert (low, high) == pytest.approx((0.4568, 0.5432), abs=2e-4)
    assert wilson_interval(1.0, 100)[1] == 1.0 and wilson_interval(1.0, 100)[0] == pytest.approx(
        0.963, abs=1e-3
    )


class SplitLog(CopyTask):
    """CopyTask that notes the split of every batch it hands out, with a validation split."""

    validation_split = "valid"

    def __init__(self):
        super().__init__()
        self.splits: list[str] = []

    def batch(self, split: str, index: int) -> Batch:
        self.splits.append(split)
        return super().batch(split, index)


def test_periodic_evaluations_read_the_validation_split_and_the_result_the_eval_split():
    task = SplitLog()
    result = fit(lookup_model(), task, steps=6, eval_every=3)
    evaluated = [s for s in task.splits if s != "train"]
    # two periodic validations of 2 batches each, then the reported evaluation
    assert evaluated == ["valid"] * 4 + ["eval"] * 2
    assert result.valid is not None and len(result.valid) == 1
    assert result.eval_accuracy == result.final_eval.accuracy


def test_stop_accuracy_ends_training_at_the_first_evaluation_that_reaches_it():
    logged = []
    result = fit(
        lookup_model(),
        steps=400,
        eval_every=5,
        stop_accuracy=0.99,
        on_step=lambda m, s: logged.append(m.get("eval/accuracy")),
    )
    assert result.stop == "accuracy" and result.steps < 400 and result.steps % 5 == 0
    assert len(logged) == result.steps
    accuracies = [a for a in logged if a is not None]
    assert accuracies[-1] >= 0.99 and all(a < 0.99 for a in accuracies[:-1])
    assert fit(lookup_model(), steps=60, eval_every=5).stop == "cap"


class Unlearnable(CopyTask):
    """Targets unrelated to the inputs: nothing to learn, the accuracy stays near chance."""

    def batch(self, split: str, index: int) -> Batch:
        batch = super().batch(split, index)
        targets = torch.randint(VOCAB, batch.targets.shape, generator=generator(9, split, index))
        return Batch(batch.inputs, targets, batch.loss_mask)


def test_patience_ends_a_learned_run_on_a_plateau_and_never_one_that_has_not_learned():
    learned = fit(lookup_model(), steps=400, eval_every=5, patience=3)
    assert learned.stop == "plateau" and learned.steps < 400
    assert learned.valid[0].accuracy > 0.99
    # A plateau before learning may precede a sudden jump: the run goes on to its cap.
    result = fit(lookup_model(), Unlearnable(), steps=100, eval_every=5, patience=3, lr=0.01)
    assert result.stop == "cap" and result.steps == 100


def test_the_learning_rate_schedule_of_a_stopped_run_is_the_cap_s():
    """An early stop ends the steps, not the schedule: the lr at each step is the one the cap's
    schedule gives (the run is the cap's run cut short, not a shorter run)."""
    lrs = []
    fit(lookup_model(), steps=400, eval_every=5, stop_accuracy=0.99, warmup=2,
        on_step=lambda m, s: lrs.append(m["train/lr"]))  # fmt: skip
    expected = [lr_at(s, lr=0.05, warmup=2, steps=400) for s in range(len(lrs))]
    assert lrs == pytest.approx(expected)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stop_accuracy": 1.5}, r"'train.stop_accuracy' must be a fraction in \(0, 1\]"),
        ({"stop_accuracy": True}, r"'train.stop_accuracy' must be a fraction"),
        ({"patience": 0}, r"'train.patience' must be a positive integer"),
        ({"patience": 2, "eval_every": 0}, r"need 'train.eval_every' > 0"),
    ],
)
def test_bad_stopping_options_are_refused_naming_them(overrides, message):
    options = dict(
        steps=4, lr=0.05, warmup=0, weight_decay=0.0, grad_clip=1.0, eval_every=2, eval_batches=1
    )
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{**options, **overrides})


def test_a_mixture_is_validated_at_every_count_and_stops_only_when_all_reach_it():
    from experiments.training.tasks import build_task
    from experiments.training.train import EvalResult, Stopper, validation_points

    task = build_task(
        {"name": "recall", "n_pairs": 4, "n_keys": 64, "n_values": 64, "train_pairs": [4, 8, 16]},
        seq_len=64,
        batch_size=2,
        seed=0,
    )
    assert [p.n_pairs for p in validation_points(task)] == [4, 8, 16]
    settings = TrainConfig(
        steps=4, lr=0.05, warmup=0, weight_decay=0.0, grad_clip=1.0, eval_every=2,
        eval_batches=1, stop_accuracy=0.99,
    )  # fmt: skip
    stopper = Stopper(settings, has_accuracy=True)
    assert stopper.check([EvalResult(0.0, 1.0), EvalResult(0.0, 0.98)]) is None
    assert stopper.check([EvalResult(0.0, 1.0), EvalResult(0.0, 0.99)]) == "accuracy"


def _patient_stopper(patience: int):
    from experiments.training.train import Stopper

    settings = TrainConfig(
        steps=4, lr=0.05, warmup=0, weight_decay=0.0, grad_clip=1.0, eval_every=2,
        eval_batches=1, patience=patience,
    )  # fmt: skip
    return Stopper(settings, has_accuracy=True)


def test_patience_reads_each_count_so_the_hardest_still_rising_keeps_a_mixture_going():
    from experiments.training.train import PLATEAU, EvalResult

    stopper = _patient_stopper(patience=2)
    # Four counts at their ceiling, the fifth gaining 2 points per evaluation: the mean gains
    # 0.4 points, under the 1-point delta, yet the run is still learning.
    for hardest in (0.50, 0.52, 0.54, 0.56, 0.58):
        results = [EvalResult(0.0, a) for a in (1.0, 1.0, 0.99, 0.95, hardest)]
        assert stopper.check(results) is None
    # Every count flat: the plateau ends it after `patience` evaluations without progress.
    flat = [EvalResult(0.0, a) for a in (1.0, 1.0, 0.99, 0.95, 0.585)]
    assert stopper.check(flat) is None
    assert stopper.check(flat) == PLATEAU


def test_patience_waits_until_the_task_is_learned():
    from experiments.training.train import EvalResult

    stopper = _patient_stopper(patience=1)
    stuck = [EvalResult(0.0, 0.2), EvalResult(0.0, 0.1)]
    assert all(stopper.check(stuck) is None for _ in range(5))
