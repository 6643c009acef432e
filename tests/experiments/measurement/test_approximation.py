"""The approximation error: against exact attention on Gaussian and on the trained reference's
q, k, v, and the job's approximation-error columns."""

from __future__ import annotations

import pytest
import torch

import variants
from experiments.measurement import approximation, measure, reference_model
from experiments.measurement.reference_model import ReferenceConfig
from tests.experiments.measurement.conftest import reference_config
from tests.reference import causal_mask, dense_attention
from variants.attention.common.base import Attention

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


# Grouped KV heads: k, v of H_kv heads dividing q's H; query head h reads key head
# h // (H / H_kv). The exact reference is grouped-head exact attention and the kernel runs on
# the same grouped k, v.
GROUPED = (1, 4, 64, 8)  # (B, H, L, D) of q; k, v have KV_HEADS heads
KV_HEADS = 2


def _grouped_reference(q, k, v, causal, grouping="contiguous"):
    """Independent grouped-head attention in fp64: k, v repeated explicitly to q's heads, then
    plain softmax attention. grouping: "contiguous" (head h reads h // (H / H_kv), the
    convention) or "interleaved" (h reads h % H_kv: the wrong one a test must catch)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    index = (
        torch.arange(heads) // group if grouping == "contiguous" else torch.arange(heads) % kv_heads
    )
    k, v = k.double()[:, index], v.double()[:, index]  # (B, H, L, D)
    mask = causal_mask(q.shape[2]) if causal else None
    return dense_attention(q.double(), k, v, mask).to(q.dtype)


class _Grouped(Attention):
    """A kernel that is `_grouped_reference` with a chosen grouping: native GQA, so it gets k, v
    of H_kv heads as the measurement hands them."""

    name = "grouped_reference"
    native_gqa = True

    def __init__(self, *, causal: bool, grouping: str):
        super().__init__(causal=causal)
        self.grouping = grouping

    def attend(self, q, k, v):
        return _grouped_reference(q, k, v, self.causal, self.grouping)


def test_gaussian_inputs_give_keys_and_values_of_the_kv_heads():
    q, k, v = next(approximation.gaussian_inputs(GROUPED, seeds=1, kv_heads=KV_HEADS))
    assert q.shape == GROUPED and k.shape == v.shape == (1, KV_HEADS, 64, 8)
    # Without grouped heads the draws are those of before (the recorded Gaussian errors hold).
    plain = next(approximation.gaussian_inputs(GROUPED, seeds=1))
    assert torch.equal(
        next(approximation.gaussian_inputs(GROUPED, seeds=1, kv_heads=4))[1], plain[1]
    )


@pytest.mark.parametrize("causal", [False, True])
def test_the_grouped_exact_reference_is_repeated_kv_softmax_attention(causal):
    q, k, v = next(approximation.gaussian_inputs(GROUPED, seeds=1, kv_heads=KV_HEADS))
    exact = approximation.exact_attention(causal=causal, shared_qk=False)(q, k, v)
    torch.testing.assert_close(exact, _grouped_reference(q, k, v, causal), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_under_grouped_kv_heads_full_has_no_error_and_a_wrong_grouping_is_caught(causal):
    def error(kernel):
        inputs = approximation.gaussian_inputs(GROUPED, seeds=2, kv_heads=KV_HEADS)
        return approximation.approx_rel_error(kernel, inputs, CPU, torch.float32)

    assert error(variants.build_attention("full", causal=causal)) < 1e-6
    assert error(_Grouped(causal=causal, grouping="contiguous")) < 1e-5
    assert error(_Grouped(causal=causal, grouping="interleaved")) > 0.05
    # A repeating (not native) variant is measured on the same grouped k, v: blockwise with one
    # block holding every key is exact.
    assert error(variants.build_attention("blockwise", causal=causal, block_size=64)) < 1e-5


def test_a_grouped_heads_job_is_measured_on_a_grouped_heads_reference(job_config, corpus, tmp_path):
    job = _approx_job(
        job_config, corpus, tmp_path, "seq_len=64", "attention=full", "model.n_kv_heads=1"
    )
    mha = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=full")
    config = ReferenceConfig.of_job(job)
    assert config.kv_heads == 1 and config.digest() != ReferenceConfig.of_job(mha).digest()
    # Without grouped heads the digest is that of before: cached references still serve.
    assert ReferenceConfig.of_job(mha).n_kv_heads is None
    assert ReferenceConfig(d_model=32, n_heads=2, n_kv_heads=2) == ReferenceConfig(32, 2)
    reference = reference_model.load_or_train(config, CPU, tmp_path)
    (q, k, v), _ = reference_model.attention_inputs(
        reference, seq_len=64, batch_size=1, index=0, device=CPU
    )
    assert q.shape[1] == 2 and k.shape[1] == v.shape[1] == 1  # (B, H_kv, L, D): grouped
    columns = approximation.approx_columns(job, measure.setup(job), (1, 2, 64, 16))
    assert columns["approx_reference_n_kv_heads"] == 1
    assert columns["approx_rel_error"] < 1e-6 and columns["approx_rel_error_gaussian"] < 1e-6
    assert columns["swap_delta_bits_per_byte"] == pytest.approx(0, abs=1e-5)
    blockwise = _approx_job(
        job_config,
        corpus,
        tmp_path,
        "seq_len=64",
        "attention=blockwise",
        "attention.block_size=16",
        "model.n_kv_heads=1",
    )
    columns = approximation.approx_columns(blockwise, measure.setup(blockwise), (1, 2, 64, 16))
    assert 0 < columns["approx_rel_error"] < 1 and columns["approx_reference_n_kv_heads"] == 1
