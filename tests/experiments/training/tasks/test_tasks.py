"""Tasks: batches are a pure function of (seed, split, index): every variant sees the same data."""

from __future__ import annotations

import pytest
import torch

from experiments.training import tasks
from experiments.training.tasks import Batch, build_task, task_names
from tests.conftest import output_of_another_process


def random_lm(seed=0, seq_len=32, batch_size=3, **options):
    return build_task(
        {"name": "random_lm", **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def same(a: Batch, b: Batch) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in ((a.inputs, b.inputs), (a.targets, b.targets), (a.loss_mask, b.loss_mask))
    )


def test_random_lm_batch_shapes_and_next_token_targets():
    batch = random_lm(vocab_size=50).batch("train", 0)
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (3, 32)
    assert batch.inputs.dtype == batch.targets.dtype == torch.int64
    assert batch.loss_mask.dtype == torch.bool and bool(batch.loss_mask.all())
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])  # targets are inputs shifted
    assert 0 <= int(batch.inputs.min()) and int(batch.targets.max()) < 50


def test_random_lm_batches_are_a_function_of_seed_split_and_index():
    task = random_lm()
    assert same(task.batch("train", 5), task.batch("train", 5))
    assert same(task.batch("eval", 2), random_lm().batch("eval", 2))  # a fresh task, same data
    others = [task.batch("train", 6), task.batch("eval", 5), random_lm(seed=1).batch("train", 5)]
    assert not any(same(task.batch("train", 5), other) for other in others)
    assert len({tuple(task.batch("train", i).inputs[0, :8].tolist()) for i in range(20)}) == 20


def test_random_lm_batches_are_the_same_in_another_process():
    script = (
        "from experiments.training.tasks import build_task; t = build_task({'name': 'random_lm'}, "
        "seq_len=16, batch_size=2, seed=7); print(t.batch('eval', 3).inputs.tolist())"
    )
    here = random_lm(seed=7, seq_len=16, batch_size=2).batch("eval", 3).inputs.tolist()
    assert output_of_another_process(script, hash_seed="999") == str(here)


def test_batch_to_moves_every_tensor():
    batch = random_lm().batch("train", 0).to(torch.device("cpu"))
    assert isinstance(batch, Batch) and batch.inputs.device.type == "cpu"


def test_random_lm_is_registered():
    assert "random_lm" in task_names()
    assert random_lm().vocab_size == 256 and not random_lm().has_accuracy


@pytest.mark.parametrize(
    "options, kwargs, words",
    [
        ({"name": "nope"}, {}, ["unknown task 'nope'", "available:", "random_lm"]),
        ({"name": "random_lm", "colour": 3}, {}, ["random_lm", "colour"]),
        ({"name": "random_lm", "vocab_size": 0}, {}, ["vocab_size", "positive"]),
        ({"name": "random_lm"}, {"seq_len": 0}, ["seq_len", "positive"]),
    ],
    ids=["unknown", "unknown_option", "vocab_size", "seq_len"],
)
def test_bad_task_options_are_value_errors_naming_them(options, kwargs, words):
    arguments = {"seq_len": 8, "batch_size": 1, "seed": 0, **kwargs}
    with pytest.raises(ValueError) as caught:
        build_task(options, **arguments)
    assert not [w for w in words if w not in str(caught.value)], str(caught.value)


def test_build_task_does_not_modify_its_options():
    options = {"name": "random_lm", "vocab_size": 11}
    build_task(options, seq_len=4, batch_size=1, seed=0)
    assert options == {"name": "random_lm", "vocab_size": 11}


@pytest.mark.parametrize("name", task_names())
def test_every_task_declares_what_the_task_protocol_asks(name):
    """`Task`'s attributes, read without a getattr default: name, vocab_size, has_accuracy and
    reports_bits_per_byte (only the byte-level tasks' loss is bits per byte)."""
    task_cls = tasks._TASKS[name]
    assert task_cls.name == name and issubclass(task_cls, tasks.SeededTask)
    assert isinstance(task_cls.has_accuracy, bool)
    assert task_cls.reports_bits_per_byte is (name in ("text", "enwik8"))
