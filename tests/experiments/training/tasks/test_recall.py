"""Multi-query associative recall: layout, distinct keys, answers, loss mask, determinism."""

from __future__ import annotations

import pytest
import torch

from experiments.training.tasks import build_task


def _task(seq_len=20, batch_size=4, seed=0, **options):
    options = {"n_pairs": 4, "n_keys": 8, "n_values": 6, **options}
    return build_task(
        {"name": "recall", **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def test_queries_are_followed_by_the_value_of_their_key():
    task = _task()
    batch = task.batch("train", 0)
    assert batch.inputs.shape == batch.targets.shape == batch.loss_mask.shape == (4, 20)
    assert task.vocab_size == 15
    tokens = torch.cat([batch.inputs, batch.targets[:, -1:]], dim=1)  # (B, L + 1)
    for row in tokens:
        keys, values = row[0:8:2], row[1:8:2]
        assert len(set(keys.tolist())) == 4  # distinct keys
        assert ((keys >= 1) & (keys <= 8)).all() and ((values >= 9) & (values <= 14)).all()
        table = dict(zip(keys.tolist(), values.tolist(), strict=True))
        queries, answers = row[8:20:2], row[9:21:2]  # (20 - 8) / 2 = 6 queries
        for key, answer in zip(queries.tolist(), answers.tolist(), strict=True):
            assert table[key] == answer


def test_only_the_answers_count():
    batch = _task().batch("eval", 2)
    expected = torch.zeros(20, dtype=torch.bool)
    expected[8:20:2] = True  # positions holding a query key predict its value
    assert torch.equal(batch.loss_mask, expected.expand(4, -1))
    assert (batch.targets[batch.loss_mask] >= 9).all()


def test_an_odd_remainder_is_padded_and_not_counted():
    batch = _task(seq_len=21).batch("train", 0)
    assert batch.inputs.shape == (4, 21)
    assert (batch.targets[:, -1] == 0).all() and not batch.loss_mask[:, -1].any()
    assert int(batch.loss_mask[0].sum()) == 6


def test_batches_are_a_pure_function_of_seed_split_and_index():
    a, b = _task(seed=3), _task(seed=3)
    assert torch.equal(a.batch("train", 1).inputs, b.batch("train", 1).inputs)
    assert not torch.equal(a.batch("train", 1).inputs, a.batch("eval", 1).inputs)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"n_pairs": 9}, "'n_pairs'=9 must be at most 'n_keys'=8"),
        ({"seq_len": 9}, "'seq_len'=9 must be at least"),
        ({"n_values": 0}, "'n_values'"),
    ],
)
def test_bad_options_are_value_errors_naming_them(options, match):
    with pytest.raises(ValueError, match=match):
        _task(**options)


# --- query_format=zoology: each key queried once at power-law slots, the answer never shown ---


def test_zoology_queries_every_key_once_and_never_shows_the_answer():
    task = _task(
        seq_len=64, batch_size=8, n_pairs=8, n_keys=16, n_values=16, query_format="zoology"
    )
    for split in ("train", "valid", "eval"):
        batch = task.batch(split, 1)
        for inputs, targets, mask in zip(batch.inputs, batch.targets, batch.loss_mask, strict=True):
            keys, values = inputs[0:16:2], inputs[1:16:2]
            table = dict(zip(keys.tolist(), values.tolist(), strict=True))
            asked = inputs[mask]
            assert sorted(asked.tolist()) == sorted(keys.tolist())  # each key exactly once
            assert [table[k] for k in asked.tolist()] == targets[mask].tolist()
            query_part = inputs[16:]
            assert not ((query_part > 16) & (query_part <= 32)).any()  # no value after the pairs
            assert (inputs[16:][~mask[16:]] == 0).all()  # the rest is padding
            assert (mask[16:].nonzero().flatten() % 2 == 0).all()  # queries at even slots


def test_zoology_query_slots_follow_a_power_law():
    """Slot s (of S) drawn with weight (s + 1)^-0.99: most queries come soon after the pairs."""
    task = _task(
        seq_len=512, batch_size=64, n_pairs=4, n_keys=16, n_values=16, query_format="zoology"
    )
    batch = task.batch("train", 0)
    slots = (batch.loss_mask[:, 8:].nonzero()[:, 1] // 2).float()  # (B * P,) in 0 .. 251
    assert float((slots < 25).float().mean()) > 0.35  # uniform slots would give 10 %
    assert float((slots >= 125).float().mean()) > 0.05  # and some are far


def test_zoology_validation_and_eval_splits_are_not_the_training_batches():
    task = _task(
        seq_len=64, batch_size=4, n_pairs=8, n_keys=16, n_values=16, query_format="zoology"
    )
    train, valid, evaluation = (task.batch(s, 0).inputs for s in ("train", "valid", "eval"))
    assert not torch.equal(train, valid) and not torch.equal(valid, evaluation)


def test_zoology_key_blind_floor_is_one_over_the_pairs():
    task = _task(
        seq_len=256, batch_size=64, n_pairs=8, n_keys=64, n_values=64, query_format="zoology"
    )
    batch = task.batch("eval", 0)
    floor = task.floor_hits(batch) / int(batch.loss_mask.sum())
    assert abs(floor - 1 / 8) < 0.05


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"query_format": "once"}, "option 'query_format' must be one of repeated, zoology"),
        (
            {"query_format": "zoology", "n_pairs": 6, "n_keys": 8},
            r"'seq_len'=20 must be at least 4 \* 'n_pairs' = 24 with query_format=zoology",
        ),
    ],
)
def test_bad_query_format_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        _task(**options)
