"""The duplication task 0w0w: layout, loss mask on the second copy only, determinism."""

from __future__ import annotations

import pytest
import torch

from experiments.training.tasks import build_task


def _task(seq_len=12, batch_size=3, seed=0, **options):
    return build_task(
        {"name": "duplication", **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def test_batch_is_two_copies_of_w_after_separators():
    task = _task(seq_len=12, n_symbols=5)
    batch = task.batch("train", 0)
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (3, 12)
    assert batch.inputs.dtype == torch.int64 and batch.loss_mask.dtype == torch.bool
    n = 5  # seq_len / 2 - 1
    w = batch.inputs[:, 1 : n + 1]
    assert (batch.inputs[:, 0] == 0).all() and (batch.inputs[:, n + 1] == 0).all()
    assert torch.equal(batch.inputs[:, n + 2 :], w)
    assert ((w >= 1) & (w <= 5)).all()
    assert task.vocab_size == 6
    # next-token targets
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])


def test_loss_mask_covers_exactly_the_predictions_of_the_second_copy():
    task = _task(seq_len=12)
    batch = task.batch("eval", 3)
    n = 5
    expected = torch.zeros(12, dtype=torch.bool)
    expected[n + 1 : 2 * n + 1] = True  # inputs 0, w_1..w_{n-1} of the second half
    assert torch.equal(batch.loss_mask, expected.expand(3, -1))
    # the counted targets are exactly the second copy of w
    assert torch.equal(batch.targets[batch.loss_mask].view(3, n), batch.inputs[:, 1 : n + 1])


def test_loss_mask_means_first_copy_errors_do_not_count():
    from experiments.training.train import masked_loss_and_hits

    task = _task(seq_len=12, n_symbols=5)
    batch = task.batch("train", 0)
    logits = torch.nn.functional.one_hot(batch.targets, task.vocab_size).float() * 20
    logits[~batch.loss_mask] = torch.randn(int((~batch.loss_mask).sum()), task.vocab_size)
    loss, hits = masked_loss_and_hits(logits, batch)
    assert loss < 1e-6 and int(hits) == int(batch.loss_mask.sum())


def test_masked_form_hides_the_second_copy_and_predicts_it_in_place():
    task = _task(seq_len=12, n_symbols=5, masked=True)
    batch = task.batch("train", 1)
    n = 5
    assert task.vocab_size == 7
    assert (batch.inputs[:, n + 2 :] == 6).all()  # the mask token
    assert torch.equal(batch.targets[:, n + 2 :], batch.inputs[:, 1 : n + 1])
    assert batch.loss_mask[:, n + 2 :].all() and not batch.loss_mask[:, : n + 2].any()
    assert not (batch.inputs[:, : n + 2] == 6).any()


def test_batches_are_a_pure_function_of_seed_split_and_index():
    a, b = _task(seed=1), _task(seed=1)
    assert torch.equal(a.batch("train", 5).inputs, b.batch("train", 5).inputs)
    assert not torch.equal(a.batch("train", 5).inputs, a.batch("train", 6).inputs)
    assert not torch.equal(a.batch("train", 5).inputs, a.batch("eval", 5).inputs)
    assert not torch.equal(a.batch("train", 5).inputs, _task(seed=2).batch("train", 5).inputs)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"seq_len": 11}, "'seq_len'.*even"),
        ({"seq_len": 2}, "'seq_len'.*at least 4"),
        ({"n_symbols": 0}, "'n_symbols'"),
        ({"masked": "yes"}, "'masked'"),
        ({"bogus": 1}, "task 'duplication'"),
    ],
)
def test_bad_options_are_value_errors_naming_them(options, match):
    with pytest.raises(ValueError, match=match):
        _task(**options)
