"""Long-range recall: layout, answers hidden, distance grows with length, determinism, errors."""

from __future__ import annotations

import pytest
import torch

from experiments.training.tasks import build_task


def _task(seq_len=64, batch_size=4, seed=0, **options):
    options = {"n_pairs": 6, "n_keys": 10, "n_values": 7, **options}
    return build_task(
        {"name": "long_recall", **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def _table(row: torch.Tensor, half: int, n_keys: int) -> dict[int, tuple[int, int]]:
    """key -> (value, position of the value) read off the first half of one input row."""
    table = {}
    for pos in range(0, half - 1):
        token, following = int(row[pos]), int(row[pos + 1])
        if 1 <= token <= n_keys:
            assert pos % 2 == 0  # pairs sit on pair-aligned slots
            assert token not in table  # distinct keys
            table[token] = (following, pos + 1)
    return table


def test_every_query_is_scored_on_its_keys_value_and_never_sees_it():
    task = _task(seq_len=66)
    batch = task.batch("train", 0)
    half = 33
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (4, 66)
    assert task.vocab_size == 1 + 10 + 7
    assert (batch.loss_mask[:, half:]).all() and not batch.loss_mask[:, :half].any()
    for inputs, targets in zip(batch.inputs, batch.targets, strict=True):
        table = _table(inputs, half, n_keys=10)
        assert len(table) == 6
        values = [v for v, _ in table.values()]
        assert all(11 <= v <= 17 for v in values)
        first_half_other = [int(t) for t in inputs[:half] if not 1 <= int(t) <= 17]
        assert set(first_half_other) <= {0}  # padding elsewhere
        for query, answer in zip(inputs[half:].tolist(), targets[half:].tolist(), strict=True):
            assert query in table and table[query][0] == answer
        # The answers are hidden: the second half holds keys only.
        assert ((inputs[half:] >= 1) & (inputs[half:] <= 10)).all()


def _mean_distance(seq_len: int) -> float:
    task = _task(seq_len=seq_len, batch_size=64, n_pairs=8, n_keys=16, n_values=16)
    distances = []
    for index in range(4):
        batch = task.batch("eval", index)
        half = seq_len // 2
        for inputs in batch.inputs:
            table = _table(inputs, half, n_keys=16)
            for offset, query in enumerate(inputs[half:].tolist()):
                distances.append(half + offset - table[query][1])
    return sum(distances) / len(distances)


def test_the_distance_to_the_answer_grows_in_proportion_to_the_length():
    short, long = _mean_distance(128), _mean_distance(512)
    assert short == pytest.approx(64, rel=0.1)  # mean seq_len / 2
    assert long == pytest.approx(256, rel=0.1)
    assert long / short == pytest.approx(4, rel=0.1)


def test_batches_are_a_function_of_seed_split_and_index():
    a, b = _task(seed=3), _task(seed=3)
    assert torch.equal(a.batch("train", 5).inputs, b.batch("train", 5).inputs)
    assert torch.equal(a.batch("train", 5).targets, b.batch("train", 5).targets)
    assert not torch.equal(a.batch("train", 5).inputs, a.batch("train", 6).inputs)
    assert not torch.equal(a.batch("train", 5).inputs, a.batch("eval", 5).inputs)
    assert not torch.equal(a.batch("train", 5).inputs, _task(seed=4).batch("train", 5).inputs)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_pairs": 11}, "'n_pairs'=11 must be at most 'n_keys'=10"),
        ({"seq_len": 20}, "must be at least 4 * 'n_pairs' = 24"),
        ({"n_values": 0}, "'n_values' must be a positive integer"),
    ],
)
def test_bad_options_name_the_option_and_the_constraint(options, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        _task(**options)
