"""Fitting a kernel's learned state to the frozen reference: the fit, the state it keeps, the
length it is fitted at and the cache key of the fitted state."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import variants
from experiments.measurement import approximation, kernel_fit, reference_model
from experiments.measurement.reference_model import ReferenceConfig
from tests.experiments.measurement.conftest import reference_config

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "attention, options", [("compressed", {"factor": 4}), ("linformer", {"k": 8})]
)
def test_a_fitted_kernel_errs_no_more_than_as_initialised(corpus, tmp_path, attention, options):
    config = reference_config(corpus, fit_steps=60)
    reference = reference_model.load_or_train(config, CPU, tmp_path)
    causal = attention != "linformer"
    kernel_config = variants.ModelConfig(
        d_model=32,
        n_heads=2,
        max_seq_len=64,
        attention=attention,
        attention_options=options,
        causal=causal,
    )
    exact = variants.build_attention("full", causal=causal)
    fitted, steps, length = kernel_fit.fitted_kernel(
        reference, kernel_config, seq_len=64, device=CPU, directory=tmp_path, exact=exact
    )
    torch.manual_seed(config.seed)
    initial = kernel_config.kernel()
    assert 0 < steps <= 60 and length == 64  # the state kept: the best on held-out text

    def error(kernel):
        inputs = approximation.trained_inputs(reference, (2, 2, 64, 16), CPU, seeds=2)
        return approximation.approx_rel_error(kernel, inputs, CPU, torch.float32)

    assert error(fitted) < 0.9 * error(initial)
    cached = list((tmp_path / "reference" / reference.digest).glob("kernel-*.pt"))
    assert len(cached) == 1  # cached beside the reference; a second call reads it
    again, _, _ = kernel_fit.fitted_kernel(
        reference, kernel_config, seq_len=64, device=CPU, directory=tmp_path, exact=exact
    )
    for a, b in zip(fitted.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_fit_that_diverges_keeps_the_state_it_started_from(corpus, tmp_path):
    """The fit keeps its best state on held-out inputs: at an absurd learning rate every step
    makes compressed's convolution worse, so it ends as initialised, at step 0."""
    reference = reference_model.load_or_train(reference_config(corpus), CPU, tmp_path)
    triples = [
        triple
        for index in range(3)
        for triple in reference_model.attention_inputs(
            reference, seq_len=64, batch_size=1, index=index, device=CPU, split="train"
        )
    ]
    torch.manual_seed(0)
    kernel = variants.build_attention("compressed", causal=True, factor=4, head_dim=16)
    initial = copy.deepcopy(kernel.state_dict())
    exact = variants.build_attention("full", causal=True)
    kept = kernel_fit.fit_kernel(
        kernel, exact, triples[:4], steps=30, lr=50.0, held_out=triples[4:]
    )
    assert kept == 0
    for name, value in kernel.state_dict().items():
        assert torch.equal(value, initial[name]), name
    unchecked = kernel_fit.fit_kernel(kernel, exact, triples[:4], steps=30, lr=50.0)
    assert unchecked == 30 and not torch.equal(
        kernel.state_dict()["key_conv.weight"], initial["key_conv.weight"]
    )


def test_a_length_free_kernel_is_fitted_once_at_fit_max_len_and_linformer_at_its_own(
    corpus, tmp_path
):
    config = reference_config(corpus, fit_steps=2, fit_max_len=32)
    assert kernel_fit.fit_length("compressed", 64, config) == 32
    assert kernel_fit.fit_length("compressed", 16, config) == 16  # shorter: its own
    assert kernel_fit.fit_length("linformer", 64, config) == 64  # per-position weights
    unbounded = dataclasses.replace(config, fit_max_len=0)
    assert kernel_fit.fit_length("compressed", 64, unbounded) == 64
    reference = reference_model.load_or_train(config, CPU, tmp_path)
    kernel_config = variants.ModelConfig(
        d_model=32, n_heads=2, max_seq_len=64, attention="compressed", causal=True
    )
    exact = variants.build_attention("full", causal=True)
    lengths = [
        kernel_fit.fitted_kernel(
            reference, kernel_config, seq_len=n, device=CPU, directory=tmp_path, exact=exact
        )[2]
        for n in (48, 64)
    ]
    assert lengths == [32, 32]
    assert len(list((tmp_path / "reference" / reference.digest).glob("kernel-*.pt"))) == 1
    with pytest.raises(ValueError, match="fit_max_len"):
        dataclasses.replace(config, fit_max_len=-1)


def test_kernels_without_learned_state_are_not_fitted(corpus, tmp_path):
    reference = reference_model.load_or_train(reference_config(corpus), CPU, tmp_path)
    sample = reference_model.attention_inputs(
        reference, seq_len=64, batch_size=1, index=0, device=CPU
    )[0]
    assert not kernel_fit.learns(variants.build_attention("blockwise", block_size=8), sample)
    assert not kernel_fit.learns(variants.build_attention("performer", head_dim=16), sample)
    routing = variants.build_attention("routing", n_heads=2, head_dim=16, window=16)
    before = routing.centroid_sums.clone()
    assert kernel_fit.learns(routing, sample)  # its centroids follow the queries
    assert torch.equal(routing.centroid_sums, before)  # checked on a copy


@pytest.mark.parametrize("attention, causal", [("nsa", True), ("linformer", False)])
def test_one_fit_serves_every_job_length_unless_the_state_is_per_position(attention, causal):
    """Jobs at 2048 and 4096 tokens fit NSA at the same 1024 tokens: one key, one fit (each
    length had its own before, as the job's length bound was in the key). Linformer's E, F
    span max_seq_len: a fit per length."""
    config = ReferenceConfig(d_model=32, n_heads=2)
    keys = set()
    for seq_len in (2048, 4096):
        kernel_config = variants.ModelConfig(
            d_model=32, n_heads=2, max_seq_len=seq_len, attention=attention, causal=causal
        )
        length = kernel_fit.fit_length(attention, seq_len, config)
        keys.add(kernel_fit.kernel_key(kernel_config, length, config))
    assert len(keys) == (1 if attention == "nsa" else 2)
