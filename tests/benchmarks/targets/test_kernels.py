"""The kernels the targets time come from the registry: a newly registered variant joins."""

from __future__ import annotations

from benchmarks.targets import kernels, speed
from variants import attention_names
from variants import registry as variant_registry
from variants.attention.linear import LinearAttention


def test_every_registered_variant_is_timed_with_the_settings_the_targets_name():
    settings = kernels.kernel_settings()
    assert list(settings) == [*attention_names(), *kernels.SAME_BLOCKS_KERNELS]
    assert settings["lsh"] == {"n_hashes": 4, "bucket_size": 64}
    assert settings["combined"] == {}  # no setting of its own: its registry defaults
    assert not kernels.kernel("linformer", 64).causal and kernels.kernel("deltanet", 64).causal


def test_a_new_variant_is_measured_and_shown_without_an_edit(monkeypatch, one_call):
    spec = variant_registry._spec("toy_linear", LinearAttention, {}, "linear, again")
    monkeypatch.setitem(variant_registry._ATTENTION._entries, "toy_linear", spec)
    assert "toy_linear" in kernels.kernel_settings()
    timings = {n: speed.time_kernels(n, 1, 0.0, ["toy_linear"]) for n in (64, 128)}
    rows = {row.name: row for row in speed.kernel_targets(timings, [64, 128])}
    assert {"toy_linear speed-up, L=128", "toy_linear scaling exponent 64->128"} <= set(rows)
    assert rows["toy_linear speed-up, L=128"].met is None  # no target of its own: shown only


def test_the_shape_is_the_runs_within_measured_at_and_the_default_after():
    small = kernels.Shape(batch=2, heads=2, head_dim=8)
    with kernels.measured_at(small):
        assert kernels.shape().randn(16).shape == (2, 2, 16, 8)
        assert kernels.model_config("full", 16).d_model == 16
    assert kernels.shape() == kernels.Shape()
