"""The approximation error: against exact attention on Gaussian and on the trained reference's
q, k, v, and the job's approximation-error columns."""

from __future__ import annotations

import pytest
import torch

import variants
from experiments.measurement import approximation, measure, reference_model
from experiments.measurement.reference_model import ReferenceConfig
from tests.experiments.measurement.conftest import reference_config

CPU = torch.device("cpu")
SHAPE = (1, 2, 128, 16)  # (B, H, L, D)


@pytest.mark.parametrize("shared_qk", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_approx_rel_error_of_exact_attention_is_zero(causal, shared_qk):
    kernel = variants.build_attention("full", causal=causal, shared_qk=shared_qk)
    inputs = approximation.gaussian_inputs(SHAPE, seeds=2)
    assert approximation.approx_rel_error(kernel, inputs, CPU, torch.float32) < 1e-6


def test_approx_rel_error_of_lsh_with_every_key_in_its_window_is_zero():
    """The reference follows the shared-QK conventions, so only hashing and chunking count."""
    kernel = variants.build_attention("lsh", causal=True, bucket_size=SHAPE[2], n_hashes=1)
    inputs = approximation.gaussian_inputs(SHAPE, seeds=2)
    assert approximation.approx_rel_error(kernel, inputs, CPU, torch.float32) < 1e-5


def test_approx_rel_error_of_lsh_is_positive_and_keeps_training_mode():
    kernel = variants.build_attention("lsh", causal=True, bucket_size=16, n_hashes=1)
    kernel.train()
    error = approximation.approx_rel_error(
        kernel, approximation.gaussian_inputs(SHAPE, 2), CPU, torch.float32
    )
    assert 0.01 < error < 2 and kernel.training


def test_error_on_trained_inputs_is_zero_for_exact_and_falls_as_the_window_grows(corpus, tmp_path):
    reference = reference_model.load_or_train(
        reference_config(corpus, steps=150, long_steps=0), CPU, tmp_path
    )
    shape = (2, 2, 128, 16)

    def error(name, **options):
        kernel = variants.build_attention(name, causal=True, **options)
        inputs = approximation.trained_inputs(reference, shape, CPU, seeds=2)
        return approximation.approx_rel_error(kernel, inputs, CPU, torch.float32)

    assert error("full") < 1e-6
    errors = [error("blockwise", block_size=b) for b in (4, 8, 32)]
    assert 0 < errors[2] < errors[1] < errors[0] < 1, errors
    assert error("blockwise", block_size=64) < 1e-6  # two blocks of 64 hold every key: exact


def _approx_job(job_config, corpus, cache, *overrides):
    return job_config(
        "model.d_model=32",
        "model.n_heads=2",
        "measure.approx_seeds=1",
        f"measure.reference.text_path={corpus}",
        f"measure.reference.cache_dir={cache}",
        "measure.reference.steps=20",
        "measure.reference.seq_len=32",
        "measure.reference.batch_size=2",
        "measure.reference.long_seq_len=64",
        "measure.reference.long_steps=2",
        "measure.reference.fit_steps=5",
        *overrides,
    )


def test_past_the_references_length_the_error_is_nan_with_a_reason(job_config, corpus, tmp_path):
    job = _approx_job(
        job_config,
        corpus,
        tmp_path,
        "seq_len=128",
        "attention=blockwise",
        "attention.block_size=16",
    )
    built = measure.setup(job)
    columns = approximation.approx_columns(job, built, (1, 2, 128, 16))
    assert columns["approx_rel_error"] is None
    assert columns["swap_delta_bits_per_byte"] is None
    assert "past the reference's trained length 64" in columns["approx_error_note"]
    assert columns["approx_reference_seq_len"] == 64
    assert columns["approx_rel_error_gaussian"] > 0  # the Gaussian figure has no length limit
    within = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=full")
    columns = approximation.approx_columns(within, measure.setup(within), (1, 2, 64, 16))
    assert columns["approx_rel_error"] < 1e-6 and "approx_error_note" not in columns
    assert columns["swap_delta_bits_per_byte"] == pytest.approx(0, abs=1e-5)  # exact for exact


def test_shared_qk_kernels_are_measured_on_a_shared_qk_reference(job_config, corpus, tmp_path):
    lsh = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=lsh")
    full = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=full")
    assert ReferenceConfig.of_job(lsh).shared_qk and not ReferenceConfig.of_job(full).shared_qk
    reference = reference_model.load_or_train(ReferenceConfig.of_job(lsh), CPU, tmp_path)
    assert reference.model.config.shared_qk and reference.digest != (
        ReferenceConfig.of_job(full).digest()
    )
