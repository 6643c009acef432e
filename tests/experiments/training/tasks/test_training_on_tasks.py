"""A real model trains on the tasks and evaluates with kernels other than its training one."""

from __future__ import annotations

import math

import pytest
import torch

import variants
from experiments.measurement import measure
from experiments.training.precision import FLOAT32
from experiments.training.tasks import build_task
from experiments.training.train import evaluate, train
from experiments.training.train_config import TrainConfig
from tests.experiments.conftest import MEASURE_NOTHING

CPU = torch.device("cpu")


def _model(attention="full", shared_qk=True, seq_len=16, **options):
    torch.manual_seed(0)
    return variants.TransformerLM(
        vocab_size=256,
        d_model=32,
        n_heads=2,
        depth=1,
        max_seq_len=seq_len,
        attention=attention,
        attention_options=options,
        shared_qk=shared_qk,
    )


EVAL = {"seed": 0, "eval_batches": 2}  # evaluate_with_kernel's settings of a job


def _built(model, task) -> measure.Setup:
    return measure.Setup(CPU, FLOAT32, task, model)


@pytest.fixture
def periodic_text(tmp_path):
    """A file whose next byte is a function of the current one: learnable in a few dozen steps."""
    path = tmp_path / "abc.txt"
    path.write_bytes(b"the quick brown fox; " * 200)
    return build_task({"name": "text", "path": str(path)}, seq_len=16, batch_size=4, seed=0)


def test_training_lowers_the_loss_on_a_learnable_task(periodic_text):
    model = _model(shared_qk=False)  # the runner's default for full attention
    before, _ = evaluate(model, periodic_text, CPU, 2)
    result = train(
        model,
        periodic_text,
        CPU,
        TrainConfig(
            steps=60,
            lr=3e-3,
            warmup=4,
            weight_decay=0.0,
            grad_clip=1.0,
            eval_every=20,
            eval_batches=2,
        ),
    )
    assert before > math.log(100)  # about uniform over bytes at the start
    assert result.eval_loss < 0.3 * before  # 0.14 measured: a margin for other BLAS builds


def test_evaluating_with_the_training_kernel_changes_nothing(periodic_text):
    model = _model()
    loss, _ = evaluate(model, periodic_text, CPU, 2)
    columns = measure.evaluate_with_kernel(
        _built(model, periodic_text), {"name": "full"}, "full", **EVAL
    )
    assert columns == {
        "eval_loss@full": pytest.approx(loss),
        "eval_bits_per_byte@full": pytest.approx(loss / math.log(2)),
    }


def test_full_model_evaluated_with_lsh_then_restored():
    task = build_task({"name": "duplication"}, seq_len=16, batch_size=2, seed=0)
    model = _model(seq_len=16)
    kernels = list(model.kernels())
    lsh = {"name": "lsh", "n_hashes": 2, "bucket_size": 4}
    first = measure.evaluate_with_kernel(_built(model, task), lsh, "lsh-2", **EVAL)
    again = measure.evaluate_with_kernel(_built(model, task), lsh, "lsh-2", **EVAL)
    assert set(first) == {"eval_loss@lsh-2", "eval_accuracy@lsh-2"}
    assert first == again  # hashing is seeded by the config's seed
    full, _ = evaluate(model, task, CPU, 2)
    assert first["eval_loss@lsh-2"] != pytest.approx(full)  # another kernel did run
    assert list(model.kernels()) == kernels and kernels[0].name == "full"
    assert not any(getattr(m, "kernel_normalises_keys", False) for m in model.modules())


def test_a_kernel_the_model_cannot_take_is_refused_and_the_model_kept():
    task = build_task({"name": "duplication"}, seq_len=16, batch_size=2, seed=0)
    model = _model(shared_qk=False)
    with pytest.raises(ValueError, match="'lsh'.*'shared_qk'"):
        measure.evaluate_with_kernel(_built(model, task), {"name": "lsh"}, "lsh", **EVAL)
    assert [k.name for k in model.kernels()] == ["full"]


def test_measure_records_a_column_per_evaluation_kernel(job_config):
    config = job_config(
        "task=duplication",
        "seq_len=16",
        "model.d_model=16",
        "model.n_heads=2",
        "model.shared_qk=true",
        "train.steps=2",
        "train.warmup=1",
        "train.eval_batches=1",
        *MEASURE_NOTHING,
        "measure.matmul_size=32",
        "+eval.attention={full: {name: full}, lsh-8: {name: lsh, n_hashes: 8, bucket_size: 4}}",
    )
    columns = measure.measure(config, measure.setup(config))
    for label in ("full", "lsh-8"):
        assert 0 <= columns[f"eval_accuracy@{label}"] <= 1
        assert columns[f"eval_loss@{label}"] > 0
    assert columns["eval_accuracy@full"] == pytest.approx(columns["eval_accuracy"])
