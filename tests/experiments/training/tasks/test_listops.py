"""ListOps: well-formed expressions, answers checked by an independent evaluator, determinism."""

from __future__ import annotations

import statistics

import pytest
import torch

from experiments.training.tasks import build_task

OPS = {
    11: max,
    12: min,
    13: lambda xs: int(statistics.median(xs)),
    14: lambda xs: sum(xs) % 10,
}


def evaluate_tokens(tokens: list[int]) -> int:
    """A stack evaluator over token ids: digits 1..10, operators 11..14, close 15."""
    stack: list[list] = [[None, []]]
    for token in tokens:
        if 1 <= token <= 10:
            stack[-1][1].append(token - 1)
        elif token in OPS:
            stack.append([token, []])
        else:
            assert token == 15
            op, args = stack.pop()
            stack[-1][1].append(OPS[op](args))
    (root,) = stack
    assert len(stack) == 1 and len(root[1]) == 1, "unbalanced expression"
    return root[1][0]


def _task(seq_len=64, seed=0, **options):
    return build_task({"name": "listops", **options}, seq_len=seq_len, batch_size=16, seed=seed)


def test_answers_are_the_values_of_the_expressions():
    task = _task()
    batch = task.batch("train", 0)
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (16, 64)
    assert task.vocab_size == 16
    for inputs, targets, mask in zip(batch.inputs, batch.targets, batch.loss_mask, strict=True):
        length = int((inputs > 0).sum())
        assert 16 <= length <= 64 and (inputs[length:] == 0).all()  # min_length = seq_len / 4
        assert mask.nonzero().flatten().tolist() == [length - 1]  # the last token answers
        assert int(targets[length - 1]) - 1 == evaluate_tokens(inputs[:length].tolist())


def test_batches_are_a_pure_function_of_seed_split_and_index():
    assert torch.equal(_task(seed=1).batch("eval", 2).inputs, _task(seed=1).batch("eval", 2).inputs)
    assert not torch.equal(
        _task(seed=1).batch("eval", 2).inputs, _task(seed=1).batch("eval", 3).inputs
    )


def test_answers_vary():
    targets = _task().batch("train", 0).targets
    assert len(set(targets[targets > 0].tolist())) > 3


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_args": 1}, "'max_args'"),
        ({"min_length": 65}, "'min_length'=65"),
        ({"max_depth": 0}, "'max_depth'"),
    ],
)
def test_bad_options_are_value_errors_naming_them(options, match):
    with pytest.raises(ValueError, match=match):
        _task(**options)


def test_the_floor_is_the_training_splits_most_frequent_answer_and_each_expression_one_answer():
    task = _task()
    prior = torch.cat([task.batch("train", i).targets for i in range(8)])
    answers = prior[prior > 0]
    majority = int(torch.bincount(answers).argmax())
    batch = task.batch("eval", 0)
    assert task.floor_hits(batch) == int((batch.targets[batch.loss_mask] == majority).sum())
    assert task.distinct_queries(batch) == 16 and task.chance_accuracy == 0.1
