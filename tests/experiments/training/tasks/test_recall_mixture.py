"""A recall mixture (`train_pairs`): training rows draw their pair count from the list, evaluation
stays at `n_pairs`, and a job trained on one is recorded at every count of the list."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.app.job import run_job
from experiments.measurement import measure
from experiments.records import store
from experiments.training.tasks import build_task
from tests.experiments import conftest

MIXTURE = [2, 3, 5]


def _task(**options):
    options = {"n_pairs": 5, "n_keys": 8, "n_values": 10, "train_pairs": MIXTURE, **options}
    return build_task({"name": "recall", **options}, seq_len=20, batch_size=12, seed=0)


def _rows(batch):
    """Per row: its pair count (the first scored position is 2 P), its table, and whether every
    scored target is its query key's value and every other position is unscored."""
    tokens = torch.cat([batch.inputs, batch.targets[:, -1:]], dim=1)  # (B, L + 1)
    for row, mask in zip(tokens.tolist(), batch.loss_mask, strict=True):
        scored = mask.nonzero().flatten().tolist()
        pairs = scored[0] // 2
        table = dict(zip(row[0 : 2 * pairs : 2], row[1 : 2 * pairs : 2], strict=True))
        yield pairs, table, row, scored


def test_training_rows_draw_their_count_from_the_mixture_with_distinct_keys_and_values():
    task = _task()
    counts = set()
    for index in range(4):
        for pairs, table, row, scored in _rows(task.batch("train", index)):
            counts.add(pairs)
            assert len(table) == pairs  # distinct keys
            assert len(set(table.values())) == pairs  # distinct values
            assert all(9 <= v <= 18 for v in table.values())
            # Loss only on the queried values: every query position, and nothing else.
            assert scored == list(range(2 * pairs, 2 * pairs + 2 * ((20 - 2 * pairs) // 2), 2))
            assert all(table[row[i]] == row[i + 1] for i in scored)
    assert counts == set(MIXTURE)  # 48 rows over three counts: each drawn


def test_evaluation_stays_at_n_pairs_and_at_pairs_moves_it():
    task = _task()
    assert {pairs for pairs, *_ in _rows(task.batch("eval", 0))} == {5}
    other = task.at_pairs(3)
    assert {pairs for pairs, *_ in _rows(other.batch("eval", 0))} == {3}
    assert other.train_pairs == task.train_pairs
    assert torch.equal(other.batch("train", 1).inputs, task.batch("train", 1).inputs)
    assert other.chance_accuracy == 1 / 10


def test_the_floor_on_a_mixture_eval_is_one_in_n_pairs_with_distinct_values():
    task = _task().at_pairs(2)
    batch = task.batch("eval", 0)
    hits = task.floor_hits(batch)
    # Two distinct values: the key-blind guess (the lower id of a tie, then the more frequent
    # so far) is right on about half the answers.
    assert 0.3 < hits / int(batch.loss_mask.sum()) < 0.7


@pytest.mark.parametrize(
    "mixture, match",
    [
        ([2, 9], r"'train_pairs'=\[2, 9\]: .* 'n_pairs'=9 must be at most 'n_keys'=8"),
        ([2, 2], r"'train_pairs'=\[2, 2\] must be a non-empty list of distinct"),
        ([], "'train_pairs'=\\[\\] must be a non-empty list"),
        ("2,3", "'train_pairs' must be a list"),
        ([2, 8], r"'train_pairs'=\[2, 8\]: .* 'seq_len'=16 must be at least .* = 18"),
        ([2, 8], None),
    ],
)
def test_a_bad_mixture_is_refused_naming_the_option(mixture, match):
    if match is None:  # the same counts at a length that fits them
        assert _task(train_pairs=mixture).train_pairs == (2, 8)
        return
    with pytest.raises(ValueError, match=match):
        build_task(
            {"name": "recall", "n_pairs": 2, "n_keys": 8, "n_values": 10, "train_pairs": mixture},
            seq_len=16,
            batch_size=2,
            seed=0,
        )


def test_too_few_values_for_a_count_of_the_mixture_is_refused():
    with pytest.raises(
        ValueError, match=r"'train_pairs'.* 'n_values'=4 must be at least 'n_pairs'=5"
    ):
        _task(n_pairs=2, n_values=4, train_pairs=[2, 5])


JOB = (
    "task=recall",
    "task.n_pairs=5",
    "task.n_keys=8",
    "task.n_values=10",
    f"task.train_pairs=[{','.join(map(str, MIXTURE))}]",
    "seq_len=20",
    "batch_size=4",
    *conftest.TINY,
    "train.eval_every=0",
    "train.eval_batches=1",
    "train.eval_pairs=16",
    *conftest.MEASURE_NOTHING,
    "logger=none",
)


def test_a_mixture_job_reports_every_other_count_as_a_point(job_config):
    job = job_config(*JOB)
    points = []
    columns = measure.measure(job, measure.setup(job), on_stage=lambda p, c: points.append((p, c)))
    assert [p.task for p, _ in points] == [(("n_pairs", 2),), (("n_pairs", 3),)]
    assert [p.label for p, _ in points] == ["n_pairs=2", "n_pairs=3"]
    for point, cols in points:
        assert point.steps == 0 and cols["trained_steps"] == 2
        assert cols["chance_accuracy"] == pytest.approx(0.1)
        assert cols["eval_distinct_pairs"] >= 16  # train.eval_pairs distinct answers
        assert 0 <= cols["floor_accuracy"] <= 1 and 0 <= cols["eval_accuracy"] <= 1
        assert cols["train_loss"] == columns["train_loss"]  # the one trained model
    assert columns["eval_distinct_pairs"] >= 16 and "curriculum_stage" not in columns


def test_each_count_is_recorded_as_the_job_config_at_that_n_pairs(resolved_config, tmp_path):
    config = resolved_config(*JOB)
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    paths = sorted((tmp_path / "0" / "stages").glob("*/result.json"))
    assert [p.parent.name for p in paths] == ["n_pairs=2", "n_pairs=3"]
    records = [json.loads(p.read_text()) for p in paths]
    assert [(r["task.n_pairs"], r["job"]) for r in records] == [
        (2, "0/n_pairs=2"),
        (3, "0/n_pairs=3"),
    ]
    assert all(r["task.train_pairs"] == rec["task.train_pairs"] for r in records)
    assert all(r["status"] == "ok" and r["floor_accuracy"] is not None for r in records)
    # A point's record is what a job at that n_pairs would record: the same hash.
    at_two = resolved_config(*JOB, "task.n_pairs=2")
    from experiments.records import record

    assert records[0]["config_hash"] == record.config_hash(at_two)
    gathered = store.gather(tmp_path)
    assert sorted(gathered["task.n_pairs"]) == [2, 3, 5]


LENGTHS = [8, 12, 20]  # one per count of MIXTURE (2, 3, 5 pairs): each fits 2 P + 2 tokens


def test_with_train_lengths_each_training_batch_is_one_count_at_its_length():
    task = _task(train_lengths=LENGTHS)
    lengths = {}
    for index in range(12):
        batch = task.batch("train", index)
        counts = {pairs for pairs, *_ in _rows(batch)}
        assert len(counts) == 1  # one count for the whole batch
        (pairs,) = counts
        length = batch.inputs.shape[1]
        assert lengths.setdefault(pairs, length) == length == LENGTHS[MIXTURE.index(pairs)]
        for _, table, row, scored in _rows(batch):
            assert len(table) == pairs and all(table[row[i]] == row[i + 1] for i in scored)
    assert set(lengths) == set(MIXTURE)  # 12 batches over three counts: each drawn
    # Evaluation and validation stay at seq_len; at_pairs keeps the lengths.
    assert task.batch("eval", 0).inputs.shape == (12, 20)
    assert task.batch("valid", 0).inputs.shape == (12, 20)
    assert task.at_pairs(3).train_lengths == tuple(LENGTHS)


def test_train_lengths_in_zoology_format_hide_the_answers_at_every_length():
    task = _task(
        train_lengths=[8, 12, 20], query_format="zoology", n_pairs=3, train_pairs=[2, 3, 5]
    )
    for index in range(8):
        batch = task.batch("train", index)
        pairs = int(batch.loss_mask.sum(dim=1)[0])  # each key queried once
        assert batch.inputs.shape[1] == LENGTHS[MIXTURE.index(pairs)]
        assert not (batch.inputs[batch.loss_mask.roll(1, dims=1)] > 8).any()  # no answer after


@pytest.mark.parametrize(
    "lengths, extra, match",
    [
        ([8, 12], {}, r"'train_lengths'=\[8, 12\] must have one length per count of 'train_pairs'"),
        (
            [8, 12, 24],
            {},
            r"'train_lengths'=\[8, 12, 24\]: each length must be at most 'seq_len'=20",
        ),
        (
            [8, 7, 20],
            {},
            r"'train_lengths'=\[8, 7, 20\]: at 3 pairs, the length=7 must be at least",
        ),
        ([8, 12, 20], {"train_pairs": None}, "'train_lengths' needs 'train_pairs'"),
        ("8,12,20", {}, "'train_lengths' must be a list"),
        ([8, 0, 20], {}, "train_lengths"),
    ],
)
def test_bad_train_lengths_are_refused_naming_the_option(lengths, extra, match):
    with pytest.raises(ValueError, match=match):
        _task(train_lengths=lengths, **extra)
