"""The pair-placing tasks' batches, pinned: each is the same as before the tasks shared their
pair placement (fixtures/batches.json was written by `python -m <this module>` on the code
before that change), so every recorded result stays reproducible from (seed, split, index)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.training.tasks import build_task

FIXTURE = Path(__file__).parent / "fixtures" / "batches.json"

# name -> (task options, seq_len, batch_size, seed): small, and every branch of each task.
TASKS = {
    "recall": ({"name": "recall", "n_pairs": 3, "n_keys": 6, "n_values": 5}, 17, 2, 0),
    "recall_repeated_values": (
        {"name": "recall", "n_pairs": 3, "n_keys": 6, "n_values": 2, "distinct_values": False},
        16,
        2,
        1,
    ),
    "recall_mixture": (
        {"name": "recall", "n_pairs": 4, "n_keys": 8, "n_values": 8, "train_pairs": [2, 4]},
        20,
        3,
        2,
    ),
    "long_recall": ({"name": "long_recall", "n_pairs": 3, "n_keys": 6, "n_values": 5}, 16, 2, 0),
    "long_recall_repeated_values": (
        {"name": "long_recall", "n_pairs": 2, "n_keys": 4, "n_values": 3, "distinct_values": False},
        12,
        2,
        3,
    ),
    "duplication": ({"name": "duplication", "n_symbols": 5}, 10, 2, 0),
    "duplication_masked": ({"name": "duplication", "n_symbols": 5, "masked": True}, 10, 2, 4),
}
BATCHES = [("train", 0), ("train", 7), ("eval", 0), ("eval", 3)]


def batches(name: str) -> dict[str, dict[str, list]]:
    """`name`'s batches of BATCHES as lists: "<split>/<index>" -> inputs, targets, loss_mask."""
    options, seq_len, batch_size, seed = TASKS[name]
    task = build_task(options, seq_len=seq_len, batch_size=batch_size, seed=seed)
    out = {}
    for split, index in BATCHES:
        batch = task.batch(split, index)
        out[f"{split}/{index}"] = {
            "inputs": batch.inputs.tolist(),
            "targets": batch.targets.tolist(),
            "loss_mask": batch.loss_mask.tolist(),
        }
    return out


@pytest.mark.parametrize("name", sorted(TASKS))
def test_batches_are_those_of_the_code_before_the_shared_pair_placement(name):
    assert batches(name) == json.loads(FIXTURE.read_text())[name]
    options, seq_len, batch_size, seed = TASKS[name]
    batch = build_task(options, seq_len=seq_len, batch_size=batch_size, seed=seed).batch("eval", 0)
    # As lists, True == 1: the types are checked apart.
    assert (batch.inputs.dtype, batch.targets.dtype) == (torch.int64, torch.int64)
    assert batch.loss_mask.dtype == torch.bool


if __name__ == "__main__":  # writes the fixture: only from code whose batches are the reference
    FIXTURE.write_text(json.dumps({name: batches(name) for name in sorted(TASKS)}) + "\n")
