"""MAD's six tasks: each generator's structure against its definition, the scored positions,
seeded reproducibility, the fixed training set and which splits are disjoint."""

from __future__ import annotations

import pytest
import torch

from experiments.training.tasks import build_task
from experiments.training.tasks.mad import BASELINE, KINDS


def mad(kind, seq_len=None, batch_size=8, seed=0, **options):
    seq_len = BASELINE.get(kind, {"seq_len": 64})["seq_len"] if seq_len is None else seq_len
    return build_task(
        {"name": "mad", "kind": kind, **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


def stream(batch, row):
    """Row `row`'s tokens: the inputs and the last target (seq_len + 1 tokens)."""
    return batch.inputs[row].tolist() + batch.targets[row, -1:].tolist()


def same(a, b) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in ((a.inputs, b.inputs), (a.targets, b.targets), (a.loss_mask, b.loss_mask))
    )


def test_defaults_are_mads_baseline_settings():
    sizes = {kind: mad(kind).vocab_size for kind in KINDS}
    assert sizes == {
        "in_context_recall": 16,
        "fuzzy_recall": 16,
        "noisy_recall": 32,
        "selective_copying": 16,
        "compression": 16,
        "memorization": 256,
    }
    assert mad("noisy_recall").frac_noise == 0.2 and mad("noisy_recall").noise_vocab_size == 16
    assert mad("selective_copying").copy_tokens == 16
    assert (mad("fuzzy_recall").key_motif, mad("fuzzy_recall").value_motif) == (3, 3)
    assert mad("memorization").train_examples == 256
    assert mad("in_context_recall").train_examples == 12_800


def _check_recall_rows(task, batch):
    """Every scored value is the value paired with its key earlier in the sequence; every
    unscored pair shows its key for the first time (or is noise); a key keeps its value."""
    n_keys = task.n_keys
    noise_from = task.vocab_size - getattr(task, "noise_vocab_size", 0)
    for row in range(batch.inputs.shape[0]):
        tokens = stream(batch, row)  # a dropped first key, then value, key, value ...
        table, shown = {}, set()
        for t in range(1, len(tokens) - 1, 2):  # key at t, value at t + 1 = target t
            key, value = tokens[t], tokens[t + 1]
            if key >= noise_from:  # a noise pair
                assert value >= noise_from and not batch.loss_mask[row, t]
                continue
            assert key < n_keys and n_keys <= value < noise_from
            assert table.setdefault(key, value) == value  # fixed within the sequence
            assert bool(batch.loss_mask[row, t]) == (key in shown)
            if key in shown:
                assert int(batch.targets[row, t]) == table[key]
            shown.add(key)
        assert batch.loss_mask[row, -1]  # the last pair is always a query
        assert not batch.loss_mask[row, 0::2].any()  # only positions holding a key are scored


@pytest.mark.parametrize("split", ["train", "eval"])
def test_in_context_recall_answers_are_the_values_paired_with_the_keys_before(split):
    task = mad("in_context_recall", seq_len=64)
    batch = task.batch(split, 0)
    assert batch.inputs.shape == (8, 64)
    _check_recall_rows(task, batch)
    # 8 keys over 32 pairs: most pairs are queries
    assert batch.loss_mask.sum() > 8 * 16


def test_noisy_recall_never_scores_noise_and_draws_it_at_its_rate():
    task = mad("noisy_recall", batch_size=64, frac_noise=0.4)
    batch = task.batch("eval", 0)
    _check_recall_rows(task, batch)
    noise = batch.inputs[:, 1::2] >= task.vocab_size - task.noise_vocab_size  # the key slots
    assert 0.35 < noise.float().mean() < 0.45
    assert not (batch.loss_mask & (batch.inputs >= 16)).any()


def _runs(tokens, n_keys, pad):
    """Row tokens as [(key run, value run, index of the value's first token)]."""
    runs, t = [], 0
    while t < len(tokens) and tokens[t] == pad:
        t += 1
    while t < len(tokens):
        start = t
        while t < len(tokens) and tokens[t] < n_keys:
            t += 1
        key, value_at = tuple(tokens[start:t]), t
        while t < len(tokens) and n_keys <= tokens[t] < pad:
            t += 1
        runs.append((key, tuple(tokens[value_at:t]), value_at))
    return runs


@pytest.mark.parametrize("split", ["train", "eval"])
def test_fuzzy_recall_scores_every_token_of_a_value_whose_key_run_was_shown(split):
    task = mad("fuzzy_recall", batch_size=16)
    batch = task.batch(split, 0)
    assert batch.inputs.shape == (16, 128)
    sizes = set()
    for row in range(16):
        tokens = stream(batch, row)
        assert tokens[0] == task.pad  # left-padded to seq_len
        table, shown = {}, set()
        for key, value, at in _runs(tokens, task.n_keys, task.pad):
            assert 1 <= len(key) <= 3 and 1 <= len(value) <= 3
            assert len(set(key)) == len(key) and len(set(value)) == len(value)  # distinct ids
            assert table.setdefault(key, value) == value
            flags = batch.loss_mask[row, at - 1 : at - 1 + len(value)].tolist()
            assert flags == [key in shown] * len(value)  # token at is target at - 1
            shown.add(key)
            sizes.add(len(key))
        assert batch.loss_mask[row, -1]  # the last value is a query
    # Training keys have every length; evaluation keys all have key_motif tokens (MAD's test).
    assert sizes == ({1, 2, 3} if split == "train" else {3})


def test_selective_copying_targets_are_the_non_blank_tokens_in_order():
    task = mad("selective_copying", seq_len=64, copy_tokens=8, batch_size=16)
    batch = task.batch("eval", 3)
    copy_at = 64 - 8 - 1
    assert (batch.inputs[:, copy_at] == task.copy).all()
    assert (batch.inputs[:, copy_at + 1 :] == task.blank).all()  # the answers are not shown
    expected = torch.zeros(64, dtype=torch.bool)
    expected[copy_at + 1 :] = True
    assert torch.equal(batch.loss_mask, expected.expand(16, -1))
    for row in range(16):
        before = batch.inputs[row, :copy_at]
        data = before[before != task.blank]
        assert torch.equal(batch.targets[row, batch.loss_mask[row]], data)
        assert len(data) == 8 and (data < task.blank).all()
    # the tokens sit at varying positions among the blanks
    places = (batch.inputs[:, :copy_at] != task.blank).float().mean(dim=0)
    assert (places > 0).sum() > 30


def test_compression_reconstructs_the_sequence_from_the_compression_token():
    task = mad("compression")
    batch = task.batch("train", 0)
    assert task.readout == "pooled"  # the model reads every position from the last state
    assert (batch.inputs[:, -1] == task.compress).all()
    assert torch.equal(batch.targets, batch.inputs)
    assert batch.loss_mask[:, :-1].all() and not batch.loss_mask[:, -1].any()
    assert int(batch.inputs[:, :-1].max()) < task.compress
    assert all(mad(kind).readout == "tokens" for kind in KINDS if kind != "compression")


def test_memorization_is_one_fixed_map_over_every_sequence_and_split():
    task = mad("memorization", batch_size=32)
    table = {}
    for split, index in [("train", 0), ("train", 7), ("eval", 0), ("valid", 4)]:
        batch = task.batch(split, index)
        assert (batch.inputs[:, 1::2] == task.insert).all()
        assert torch.equal(batch.loss_mask[0], torch.arange(32) % 2 == 1)
        keys, values = batch.inputs[:, 0::2], batch.targets[:, 1::2]
        for key, value in zip(keys.flatten().tolist(), values.flatten().tolist(), strict=True):
            assert table.setdefault(key, value) == value
        assert not ((batch.inputs >= task.n_keys) & (batch.inputs < task.insert)).any()
    assert len(set(table.values())) == len(table)  # distinct values
    assert len(table) > 100  # nearly all 127 keys seen
    # another task with the same seed has the same map; another seed another one
    again = mad("memorization", batch_size=32).batch("eval", 9)
    assert all(
        table.get(k, v) == v
        for k, v in zip(
            again.inputs[:, 0::2].flatten().tolist(),
            again.targets[:, 1::2].flatten().tolist(),
            strict=True,
        )
    )
    other = mad("memorization", batch_size=32, seed=1).batch("eval", 0)
    pairs = zip(other.inputs[:, 0].tolist(), other.targets[:, 1].tolist(), strict=True)
    assert any(table.get(k, v) != v for k, v in pairs)


@pytest.mark.parametrize("kind", KINDS)
def test_batches_are_a_pure_function_of_seed_split_and_index(kind):
    a, b = mad(kind, seq_len=64 if kind != "selective_copying" else 128), None
    b = mad(kind, seq_len=a.seq_len)
    for split, index in [("train", 3), ("eval", 1), ("valid", 1)]:
        assert same(a.batch(split, index), b.batch(split, index))
    assert not same(a.batch("eval", 1), a.batch("valid", 1))
    assert not same(a.batch("eval", 1), a.batch("eval", 2))
    assert not same(a.batch("eval", 1), mad(kind, seq_len=a.seq_len, seed=1).batch("eval", 1))


def _rows(batch):
    return {tuple(row) for row in batch.inputs.tolist()}


@pytest.mark.parametrize("kind", ["in_context_recall", "selective_copying", "compression"])
def test_training_draws_from_a_fixed_set_of_train_examples_and_evaluation_is_disjoint(kind):
    task = mad(kind, seq_len=64, train_examples=20, batch_size=16)
    seen = set().union(*(_rows(task.batch("train", i)) for i in range(12)))
    assert len(seen) == 20  # 192 draws from the 20 sequences of the training set
    held_out = _rows(task.batch("eval", 0)) | _rows(task.batch("valid", 0))
    assert not held_out & seen
    # The training set is the same whatever the batch size (a function of seed and options).
    other = mad(kind, seq_len=64, train_examples=20, batch_size=5)
    assert set().union(*(_rows(other.batch("train", i)) for i in range(30))) == seen


def test_the_floor_is_the_most_frequent_answer_so_far_and_beats_chance_with_repeats():
    task = mad("in_context_recall", seq_len=64, batch_size=32)
    batch = task.batch("eval", 0)
    hits = 0
    for row in range(32):
        counts = {}
        for t, token in enumerate(batch.inputs[row].tolist()):
            if token >= task.n_keys:
                counts[token] = counts.get(token, 0) + 1
            if batch.loss_mask[row, t]:
                best = max(counts.values())
                guess = min(v for v, c in counts.items() if c == best)
                hits += guess == int(batch.targets[row, t])
    assert task.floor_hits(batch) == hits
    scored = int(batch.loss_mask.sum())
    assert task.chance_accuracy == 1 / 8 < hits / scored  # values drawn with replacement


def test_the_floor_of_compression_is_the_mode_of_the_whole_sequence():
    task = mad("compression", batch_size=16)
    batch = task.batch("eval", 0)
    data = batch.inputs[:, :-1]
    mode = torch.stack([torch.bincount(row, minlength=15).argmax() for row in data])
    assert task.floor_hits(batch) == int((data == mode[:, None]).sum())


def test_distinct_queries_count_what_an_interval_rests_on():
    task = mad("in_context_recall", seq_len=64, batch_size=4)
    batch = task.batch("eval", 0)
    asked = {(r, int(batch.inputs[r, t])) for r, t in batch.loss_mask.nonzero().tolist()}
    assert task.distinct_queries(batch) == len(asked) <= 4 * 8  # 8 keys per sequence
    copy = mad("selective_copying", seq_len=64, copy_tokens=8, batch_size=4)
    assert copy.distinct_queries(copy.batch("eval", 0)) == 32
    memorize = mad("memorization", batch_size=4)
    batch = memorize.batch("eval", 0)
    assert memorize.distinct_queries(batch) == len(set(batch.inputs[:, 0::2].flatten().tolist()))
    fuzzy = mad("fuzzy_recall", batch_size=4)
    batch = fuzzy.batch("eval", 0)
    assert 4 <= fuzzy.distinct_queries(batch) <= int(batch.loss_mask.sum())


@pytest.mark.parametrize(
    "kind, options, match",
    [
        ("in_context_recall", {"copy_tokens": 4}, "'copy_tokens' does not apply"),
        ("in_context_recall", {"seq_len": 63}, "'seq_len'=63 must be even"),
        ("selective_copying", {"seq_len": 33, "copy_tokens": 16}, "more than 2 \\* copy_tokens"),
        ("noisy_recall", {"frac_noise": 1.0}, "'frac_noise'=1.0 must be in"),
        ("noisy_recall", {"vocab_size": 18}, "at least 4 ids"),
        ("fuzzy_recall", {"vocab_size": 6}, "key_motif=3 distinct key ids"),
        ("fuzzy_recall", {"seq_len": 20}, "at least 4 \\* \\(key_motif"),
        ("nope", {}, "'kind' must be one of"),
    ],
)
def test_bad_options_are_value_errors_naming_them(kind, options, match):
    with pytest.raises(ValueError, match=match):
        mad(kind, **options)
