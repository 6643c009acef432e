"""Mixed precision: float32 master weights, autocast forward passes, a loss close to float32's."""

from __future__ import annotations

import warnings

import pytest
import torch

from experiments.measurement import measure
from experiments.training.precision import Precision
from tests.experiments import conftest

SHORT_RUN = (
    "task=text",
    "seq_len=64",
    "batch_size=4",
    *conftest.TINY,
    "train.steps=8",
    "train.warmup=2",
    "train.eval_every=0",
    "train.eval_batches=1",
    *conftest.MEASURE_NOTHING,
    "logger=none",
)


def _train(job_config, dtype, attention="full"):
    config = job_config(*SHORT_RUN, f"dtype={dtype}", f"attention={attention}")
    built = measure.setup(config)
    columns = measure.measure(config, built)
    return built, columns


@pytest.mark.parametrize("dtype, label", [("bfloat16", "bf16-mixed"), ("float16", "fp16-mixed")])
def test_half_precision_trains_with_float32_weights_close_to_float32(job_config, dtype, label):
    _, reference = _train(job_config, "float32")
    built, columns = _train(job_config, dtype)
    assert columns["precision"] == label and reference["precision"] == "float32"
    assert all(p.dtype == torch.float32 for p in built.model.parameters())
    assert built.dtype == getattr(torch, dtype)
    assert columns["train_loss"] == pytest.approx(reference["train_loss"], rel=0.02)
    assert columns["eval_loss"] == pytest.approx(reference["eval_loss"], rel=0.02)


def test_the_kernels_run_in_the_half_type_under_autocast(job_config):
    config = job_config(*SHORT_RUN, "dtype=bfloat16", "attention=linformer", "model.causal=false")
    built = measure.setup(config)
    seen = []
    kernel = next(iter(built.model.kernels()))
    kernel.register_forward_hook(lambda _m, args, out: seen.append((args[0].dtype, out.dtype)))
    with built.precision.autocast():
        built.model(built.task.batch("train", 0).inputs)
    assert seen == [(torch.bfloat16, torch.bfloat16)]


def test_only_float16_scales_the_loss_on_any_device_and_bad_names_are_refused():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert Precision.of("float16", cpu).grad_scaler().is_enabled()  # methods: fp16 needs a scaler
    assert Precision.of("bfloat16", cuda).grad_scaler() is None
    assert Precision.of("float32", cpu).grad_scaler() is None
    with warnings.catch_warnings():  # "CUDA is not available. Disabling." on a CPU machine
        warnings.simplefilter("ignore", UserWarning)
        assert Precision.of("float16", cuda).grad_scaler() is not None
    with pytest.raises(ValueError, match="'dtype' must be one of float32, bfloat16, float16"):
        Precision.of("int8", cpu)
