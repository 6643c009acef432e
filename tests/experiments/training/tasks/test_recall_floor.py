"""Recall tasks' floors: distinct values, the key-blind floor on a fixture, distinct pairs."""

from __future__ import annotations

import pytest
import torch

from experiments.training.tasks import Batch, build_task
from experiments.training.tasks.recall import RecallScoring

RECALL_TASKS = ("recall", "long_recall")


def _task(name, *, seq_len=64, batch_size=8, seed=0, **options):
    options = {"n_pairs": 8, "n_keys": 16, "n_values": 8, **options}
    return build_task({"name": name, **options}, seq_len=seq_len, batch_size=batch_size, seed=seed)


def _context_values(task, inputs):
    first = 1 + task.n_keys
    return [row[(row >= first)].tolist() for row in inputs]


@pytest.mark.parametrize("name", RECALL_TASKS)
def test_values_are_distinct_in_every_sequence_by_default(name):
    task = _task(name)  # 8 pairs over 8 values: each value exactly once
    for index in range(3):
        batch = task.batch("train", index)
        for row, values in zip(batch.inputs, _context_values(task, batch.inputs), strict=True):
            pairs = values[: task.n_pairs] if name == "recall" else values
            assert sorted(pairs) == list(range(1 + task.n_keys, 1 + task.n_keys + 8)), row


@pytest.mark.parametrize("name", RECALL_TASKS)
def test_with_replacement_values_repeat_and_the_floor_beats_one_in_n_pairs(name):
    task = _task(name, distinct_values=False, batch_size=64)
    batch = task.batch("eval", 0)
    repeats = [
        len(v[: task.n_pairs]) > len(set(v[: task.n_pairs]))
        for v in _context_values(task, batch.inputs)
    ]
    assert sum(repeats) > 32
    scored = int(batch.loss_mask.sum())
    assert task.floor_hits(batch) / scored > 1.3 / task.n_pairs


@pytest.mark.parametrize("name", RECALL_TASKS)
def test_distinct_values_bring_the_floor_down_to_one_in_n_pairs(name):
    task = _task(name, batch_size=256)
    batch = task.batch("eval", 0)
    floor = task.floor_hits(batch) / int(batch.loss_mask.sum())
    assert floor == pytest.approx(1 / task.n_pairs, abs=0.03)
    assert task.chance_accuracy == 1 / 8


@pytest.mark.parametrize("name", RECALL_TASKS)
def test_too_few_values_for_distinct_pairs_is_refused(name):
    with pytest.raises(
        ValueError, match=r"'n_values'=4 must be at least 'n_pairs'=8 with distinct"
    ):
        _task(name, n_values=4)
    _task(name, n_values=4, distinct_values=False)  # with replacement it is fine


class _Fixture(RecallScoring):
    n_keys, n_values, n_pairs = 3, 3, 3  # keys 1..3, values 4..6


def test_the_floor_is_the_most_frequent_value_so_far_on_a_hand_made_batch():
    inputs = torch.tensor([[1, 4, 2, 4, 3, 5, 1, 2, 3], [1, 6, 2, 5, 3, 5, 2, 1, 0]])
    targets = torch.tensor([[4, 0, 4, 0, 5, 0, 4, 4, 5], [6, 0, 5, 0, 5, 0, 5, 6, 0]])
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[:, 6:8] = True
    mask[0, 8] = True
    batch = Batch(inputs, targets, mask)
    # Row 0 at 6, 7, 8: counts {4: 2, 5: 1} -> guess 4; targets 4, 4, 5 -> 2 hits.
    # Row 1 at 6, 7: counts {5: 2, 6: 1} -> guess 5; targets 5, 6 -> 1 hit.
    assert _Fixture().floor_hits(batch) == 3
    # Distinct (row, key) queried: row 0 keys 1, 2, 3; row 1 keys 2, 1.
    assert _Fixture().distinct_queries(batch) == 5
