"""measure.decode: the decode columns of a job, in-process on tiny configurations."""

from __future__ import annotations

import math

import pytest
import torch

import variants
from experiments.measurement import measure
from experiments.measurement.decode_cost import measure_decode
from experiments.records import record
from tests.experiments import conftest

CPU = torch.device("cpu")
DECODE_ONLY = (
    "seq_len=48",
    *conftest.TINY,
    *conftest.MEASURE_NOTHING,
    "train.steps=0",
    "measure.decode=true",
    "measure.decode_steps=4",
    "logger=none",
)
DECODE = {
    "decode_prefill_ms",
    "decode_prefill_peak_bytes",
    "decode_state_bytes",
    "decode_ms_per_token",
    "decode_iqr_ms_per_token",
    "decode_copy_gb_per_s",
    "decode_read_gb_per_s",
    "decode_bandwidth_fraction",
}


def test_a_decode_job_records_the_decode_columns(job_config):
    config = job_config(*DECODE_ONLY, "attention=full")
    columns = measure.measure(config, measure.setup(config))
    assert DECODE <= set(columns)
    assert all(record.column(name) is not None for name in columns)
    # Exact attention's cache after the prefill: keys and values of 48 positions, fp32.
    assert columns["decode_state_bytes"] == 2 * 1 * 2 * 48 * 16 * 4
    for name in DECODE:
        assert math.isfinite(columns[name]) and columns[name] > 0, name
    assert columns["decode_read_gb_per_s"] == pytest.approx(
        columns["decode_state_bytes"] / (columns["decode_ms_per_token"] * 1e-3) / 1e9
    )
    assert columns["decode_bandwidth_fraction"] == pytest.approx(
        columns["decode_read_gb_per_s"] / columns["decode_copy_gb_per_s"]
    )
    # The prefill's peak holds at least the cache it fills.
    assert columns["decode_prefill_peak_bytes"] >= columns["decode_state_bytes"]


def test_decode_is_off_by_default_and_refused_where_impossible(job_config):
    config = job_config(*DECODE_ONLY[:-3], "logger=none")
    assert not config.measure.decode
    assert not DECODE & set(measure.measure(config, measure.setup(config)))
    bidirectional = job_config(*DECODE_ONLY, "attention=linformer", "model.causal=false")
    with pytest.raises(ValueError, match="measure.decode=true, but it cannot decode"):
        measure.measure(bidirectional, measure.setup(bidirectional))
    with pytest.raises(ValueError, match="measure.decode_steps' must be an int >= 2"):
        job_config(*DECODE_ONLY, "measure.decode_steps=1")


@pytest.mark.parametrize(
    ("name", "state_bytes"),
    [
        ("linear", 1 * 2 * 8 * 9 * 4),  # S' = sum phi(k) [v, 1]^T, fp32
        ("deltanet", 1 * 2 * 8 * 8 * 4),  # S, d x d: a gated kernel, given sampled gates
    ],
)
def test_fixed_state_caches_do_not_grow_with_the_context(name, state_bytes):
    kernel = variants.build_attention(name, causal=True)
    sizes = [
        measure_decode(kernel, (1, 2, length, 8), CPU, torch.float32, steps=2, warmup=0)[
            "decode_state_bytes"
        ]
        for length in (16, 64)
    ]
    assert sizes[0] == sizes[1] == state_bytes


def test_a_grouped_heads_job_decodes_over_a_cache_of_n_kv_heads(job_config):
    """model.n_kv_heads=1 under 2 query heads: exact attention's cache holds one head's keys
    and values (its decode takes grouped heads natively), half the plain cache."""
    plain = job_config(*DECODE_ONLY, "attention=full")
    grouped = job_config(*DECODE_ONLY, "attention=full", "model.n_kv_heads=1")
    sizes = [measure.measure(c, measure.setup(c))["decode_state_bytes"] for c in (plain, grouped)]
    assert sizes == [2 * 1 * 2 * 48 * 16 * 4, 2 * 1 * 1 * 48 * 16 * 4]


def test_a_variant_that_repeats_kv_heads_decodes_grouped_inputs_as_repeated_ones():
    """DeltaNet's state is per query head (its beta gate is), so grouped keys are repeated."""
    kernel = variants.build_attention("deltanet", causal=True)
    shape = (1, 4, 16, 8)
    grouped = measure_decode(kernel, shape, CPU, torch.float32, steps=2, warmup=0, kv_heads=2)
    plain = measure_decode(kernel, shape, CPU, torch.float32, steps=2, warmup=0)
    # Its cache holds the repeated heads.
    assert grouped["decode_state_bytes"] == plain["decode_state_bytes"]


def test_a_native_grouped_variant_decodes_over_a_cache_of_n_kv_heads():
    kernel = variants.build_attention("blockwise", causal=True, block_size=8)
    shape = (1, 4, 16, 8)
    grouped = measure_decode(kernel, shape, CPU, torch.float32, steps=2, warmup=0, kv_heads=2)
    plain = measure_decode(kernel, shape, CPU, torch.float32, steps=2, warmup=0)
    # H_kv = H / 2 heads of keys.
    assert 2 * grouped["decode_state_bytes"] == plain["decode_state_bytes"]


def test_a_hybrid_stack_decodes_with_the_whole_model_each_layer_its_cache(job_config):
    """measure.decode_scope=model: the state is every layer's cache summed (exact attention's
    keys and values of 48 positions in two layers, linear attention's d x (d + 1) in two)."""
    config = job_config(
        *DECODE_ONLY,
        "attention=full",
        "model.depth=4",
        "model.layers=[linear,full]",
        "measure.decode_scope=model",
    )
    columns = measure.measure(config, measure.setup(config))
    assert DECODE <= set(columns)
    full, linear = 2 * 1 * 2 * 48 * 16 * 4, 1 * 2 * 16 * 17 * 4
    assert columns["decode_state_bytes"] == 2 * full + 2 * linear
    assert columns["decode_prefill_peak_bytes"] >= columns["decode_state_bytes"]
    with pytest.raises(ValueError, match="'measure.decode_scope' must be one of kernel, model"):
        job_config(*DECODE_ONLY, "measure.decode_scope=layers")


def test_a_hybrid_times_the_jobs_attention_alone(job_config):
    """The kernel timed alone (kernel-scope decode, the kernel figures) is the job's attention
    with its options, not the stack's first layer's."""
    config = job_config(
        *DECODE_ONLY, "attention=full", "model.depth=2", "model.layers=[linear,full]"
    )
    built = measure.setup(config)
    assert built.kernel.name == "full" and built.kernel is list(built.model.kernels())[1]
    assert measure.measure(config, built)["decode_state_bytes"] == 2 * 1 * 2 * 48 * 16 * 4
    absent = job_config(*DECODE_ONLY, "attention=full", "model.depth=2", "model.layers=[linear]")
    built = measure.setup(absent)
    assert built.kernel.name == "full"
    assert all(kernel.name == "linear" for kernel in built.model.kernels())


STATE_ONLY = (*DECODE_ONLY[:-3], "measure.decode_state=true", "logger=none")


@pytest.mark.parametrize(
    ("overrides", "timed"),
    [
        (("attention=full",), ("measure.decode=true",)),
        (("attention=sliding_window", "attention.window=16"), ("measure.decode=true",)),
        (
            ("attention=full", "model.depth=4", "model.layers=[gated_deltanet,full]"),
            ("measure.decode=true", "measure.decode_scope=model"),
        ),
    ],
)
def test_decode_state_alone_is_the_timed_decodes_state_and_times_nothing(
    job_config, overrides, timed
):
    """measure.decode_state: decode_state_bytes from one untimed prefill, the figure the timed
    decode records at the same scope, and no other decode column."""
    scope = [o for o in timed if o.startswith("measure.decode_scope")]
    alone = job_config(*STATE_ONLY, *overrides, *scope)
    columns = measure.measure(alone, measure.setup(alone))
    assert set(columns) & DECODE == {"decode_state_bytes"}
    with_timing = job_config(*DECODE_ONLY[:-3], "logger=none", *overrides, *timed)
    timed_columns = measure.measure(with_timing, measure.setup(with_timing))
    assert columns["decode_state_bytes"] == timed_columns["decode_state_bytes"]


def test_decode_state_is_refused_where_there_is_no_decoder(job_config):
    config = job_config(*STATE_ONLY, "attention=linformer", "model.causal=false")
    with pytest.raises(ValueError, match="measure.decode_state=true, but it cannot decode"):
        measure.measure(config, measure.setup(config))
    with pytest.raises(ValueError, match="'measure.decode_state' must be true or false"):
        job_config(*STATE_ONLY[:-2], "measure.decode_state=3")


def test_a_trained_mixture_records_the_state_at_every_count(job_config):
    """On a recall mixture (the capacity preset's), every count's record carries the state."""
    config = job_config(
        *STATE_ONLY[:-3],
        "train.steps=2",
        "task=recall",
        "task.n_pairs=4",
        "task.train_pairs=[4,8]",
        "task.n_keys=16",
        "task.n_values=16",
        "measure.decode_state=true",
        "logger=none",
    )
    points = []
    columns = measure.measure(config, measure.setup(config), on_stage=lambda s, c: points.append(c))
    assert points and columns["decode_state_bytes"] > 0
    assert [p["decode_state_bytes"] for p in points] == [columns["decode_state_bytes"]]
