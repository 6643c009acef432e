"""What one job measures, in-process on a tiny configuration."""

from __future__ import annotations

import math
import time

import pytest
import torch

import variants
from experiments.measurement import kernel_rounds, measure, timing
from experiments.measurement.memory import peak_memory_bytes
from experiments.records import record
from tests.experiments import conftest
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR, Attention
from variants.checks import UnsupportedCombination

CPU = torch.device("cpu")
TINY = (
    "seq_len=64",
    *conftest.TINY,
    "train.eval_every=1",
    "train.eval_batches=1",
    "logger=none",
)
ALWAYS = {
    "device",
    "precision",
    "threads",
    "n_parameters",
    "matmul_peak_gflops_per_s",  # None unless the kernel is timed (in its rounds)
    "peak_rss_bytes",
    "timing_warning",
    "kernel_path",
    "sdpa_backend",
}
TRAINING = {
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "tokens_per_s",
    "train_stop",
    "trained_steps",
    "valid_loss",
}
KERNEL = {
    "attn_fwd_ms",
    "attn_fwd_iqr_ms",
    "attn_fwd_bwd_ms",
    "attn_fwd_bwd_iqr_ms",
    "attn_fwd_flops",
    "attn_fwd_bwd_flops",
    "attn_fwd_gflops_per_s",
    "attn_fwd_bwd_gflops_per_s",
    "attn_fwd_bwd_matmul_fraction",
    "matmul_fraction_warning",
}
# measure.speedup_vs=[sdpa] (the default): the kernel against SDPA in alternating rounds.
SPEEDUPS = {
    "speedup_vs_sdpa",
    "speedup_vs_sdpa_iqr",
    "fwd_speedup_vs_sdpa",
    "fwd_speedup_vs_sdpa_iqr",
    "speedup_rounds",
}


def test_measure_returns_every_column_with_consistent_units(job_config):
    config = job_config(*TINY, "attention=blockwise", "attention.block_size=16")
    steps = []
    columns = measure.measure(config, measure.setup(config), on_step=lambda m, s: steps.append(s))
    assert set(columns) == ALWAYS | TRAINING | KERNEL | SPEEDUPS | {
        "step_ms",
        "step_iqr_ms",
        "peak_memory_bytes",
        "attn_fwd_bwd_peak_bytes",
        "approx_rel_error",
        "approx_rel_error_gaussian",
        "approx_reference_digest",
        "approx_reference_bits_per_byte",
        "approx_reference_seq_len",
        "approx_reference_n_kv_heads",
        "approx_kernel_fit_steps",
        "approx_kernel_fit_seq_len",
        "swap_delta_bits_per_byte",
    }
    assert steps == [0, 1]
    assert all(record.column(name) is not None for name in columns)  # the schema's columns
    assert columns["device"] == "cpu" and columns["eval_accuracy"] is None
    for key in (
        "attn_fwd_ms",
        "attn_fwd_bwd_ms",
        "step_ms",
        "tokens_per_s",
        "train_loss",
        "matmul_peak_gflops_per_s",
        "peak_rss_bytes",
        "n_parameters",
    ):
        assert math.isfinite(columns[key]) and columns[key] > 0, key
    assert isinstance(columns["peak_memory_bytes"], int) and columns["peak_memory_bytes"] > 0
    assert columns["attn_fwd_bwd_flops"] == int(columns["attn_fwd_flops"] * FWD_BWD_FLOP_FACTOR)
    # FLOP/s from FLOPs and milliseconds: flops / (ms * 1e-3) / 1e9.
    assert columns["attn_fwd_gflops_per_s"] == pytest.approx(
        columns["attn_fwd_flops"] / (columns["attn_fwd_ms"] * 1e-3) / 1e9
    )
    # The fraction is the median of per-round ratios, not the ratio of the medians: close.
    assert columns["attn_fwd_bwd_matmul_fraction"] == pytest.approx(
        columns["attn_fwd_bwd_gflops_per_s"] / columns["matmul_peak_gflops_per_s"], rel=0.5
    )
    assert columns["matmul_fraction_warning"] is (columns["attn_fwd_bwd_matmul_fraction"] > 1.05)
    assert 0 < columns["approx_rel_error"] < 1  # a query sees 2 blocks of 16 of up to 64 keys
    assert columns["approx_rel_error_gaussian"] > 0
    assert columns["approx_reference_bits_per_byte"] > 0
    assert columns["approx_kernel_fit_steps"] == 0  # blockwise has nothing to fit
    assert columns["approx_kernel_fit_seq_len"] is None
    assert math.isfinite(columns["swap_delta_bits_per_byte"])


def test_measure_skips_what_is_switched_off(job_config):
    config = job_config(
        *TINY,
        "train.steps=0",
        "measure.kernel=false",
        "measure.step=false",
        "measure.memory=false",
        "measure.approx_error=false",
    )
    assert set(measure.measure(config, measure.setup(config))) == ALWAYS


def test_kernel_memory_shows_the_score_matrix_of_the_quadratic_kernel_only(job_config):
    def kernel_memory(impl):
        config = job_config(
            *TINY,
            "seq_len=256",
            "attention=full",
            f"attention.impl={impl}",
            "train.steps=0",
            "measure.kernel=false",
            "measure.step=false",
            "measure.approx_error=false",
        )
        return measure.measure(config, measure.setup(config))["attn_fwd_bwd_peak_bytes"]

    scores = 1 * 2 * 256 * 256 * 4  # (B, H, L, L) float32: what impl=math holds, SDPA never
    assert kernel_memory("math") > scores > kernel_memory("sdpa") > 0


@pytest.mark.parametrize("cpu_fused", [True, False])
def test_the_record_says_which_path_the_kernel_ran(job_config, monkeypatch, cpu_fused):
    from variants.attention.common import flash

    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", cpu_fused)
    quiet = ("train.steps=0", "measure.kernel=false", "measure.step=false")
    off = (*quiet, "measure.memory=false", "measure.approx_error=false")
    paths = {}
    for attention in ("lsh", "linear", "full"):
        config = job_config(*TINY, *off, f"attention={attention}")
        paths[attention] = measure.measure(config, measure.setup(config))["kernel_path"]
    assert paths == {
        "lsh": "fused" if cpu_fused else "explicit",
        "linear": "explicit",
        "full": "fused",  # SDPA
    }


def test_the_record_names_the_sdpa_backend_of_full_attention_only(job_config):
    off = ("train.steps=0", *conftest.MEASURE_NOTHING)
    backends = {}
    for attention in ("full", "full attention.impl=sdpa_math", "full attention.impl=math", "lsh"):
        config = job_config(*TINY, *off, *f"attention={attention}".split())
        backends[attention] = measure.measure(config, measure.setup(config))["sdpa_backend"]
    assert backends == {
        "full": "flash",  # PyTorch's choice on CPU for contiguous 4-d inputs, asked of PyTorch
        "full attention.impl=sdpa_math": "math",  # pinned
        "full attention.impl=math": None,  # no SDPA
        "lsh": None,
    }
    assert record.column("sdpa_backend").part == record.MEASURED


def test_setup_refuses_a_pinned_backend_that_cannot_run_here_as_unsupported(job_config):
    if torch.cuda.is_available():
        pytest.skip("a CUDA build may have the efficient backend")
    config = job_config(*TINY, "attention=full", "attention.impl=sdpa_efficient", "device=cpu")
    with pytest.raises(UnsupportedCombination, match="attention.impl='sdpa_efficient' pins"):
        measure.setup(config)  # the runner records it `skipped`, before any training


def test_setup_builds_the_configured_model(job_config):
    config = job_config(
        *TINY, "attention=lsh", "attention.bucket_size=16", "model.depth=2", "model.causal=false"
    )
    built = measure.setup(config)
    kernels = [m for m in built.model.modules() if isinstance(m, Attention)]
    assert len(kernels) == 2 and built.kernel is kernels[0]
    assert kernels[0].name == "lsh" and kernels[0].bucket_size == 16 and not kernels[0].causal
    assert built.task.vocab_size == config.task["vocab_size"]
    assert (built.device, built.dtype) == (CPU, torch.float32)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["seq_len=0"], ["seq_len", "positive"]),
        (["batch_size=-1"], ["batch_size", "positive"]),
        (["model.n_heads=3"], ["d_model", "n_heads"]),
        (["attention=linformer", "model.causal=true"], ["linformer", "causal"]),
        (["device=tpu"], ["device", "auto, cpu, cuda"]),
        (["dtype=int8"], ["dtype", "float32"]),
        (["task.vocab_size=0"], ["vocab_size", "positive"]),
    ],
    ids=["seq_len", "batch_size", "n_heads", "causal_linformer", "device", "dtype", "vocab_size"],
)
def test_setup_rejects_bad_options_naming_them(job_config, overrides, words):
    with pytest.raises(ValueError) as caught:
        measure.setup(job_config(*TINY, *overrides))
    assert not [w for w in words if w not in str(caught.value)], str(caught.value)


def test_setup_refuses_to_train_a_forward_only_kernel_naming_the_options(job_config):
    # FlexAttention has no CPU backward: training, the step time and its memory need one.
    config = job_config(*TINY, "attention=bigbird", "attention.impl=flex", "device=cpu")
    with pytest.raises(ValueError) as caught:
        measure.setup(config)
    for words in ("impl='flex'", "forward only", "train.steps", "measure.step", "measure.memory"):
        assert words in str(caught.value)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_forward_only_kernel_is_timed_forward(job_config, monkeypatch):
    from variants.attention.common import flex

    monkeypatch.setattr(flex, "COMPILE", False)  # eager: the same function, no compile time
    config = job_config(
        *TINY,
        "attention=blockwise",
        "attention.impl=flex",
        "attention.block_size=16",
        "train.steps=0",
        "measure.step=false",
        "measure.memory=false",
    )
    columns = measure.measure(config, measure.setup(config))
    assert (
        columns["attn_fwd_ms"] > 0 and columns["attn_fwd_bwd_ms"] is None
    )  # not measured, not NaN
    assert columns["approx_rel_error"] > 0


def test_the_kernel_is_timed_in_rounds_against_exact_attention_of_its_own_kind(
    job_config, monkeypatch
):
    config = job_config(
        *TINY,
        "attention=linformer",
        "model.causal=false",
        "train.steps=0",
        "measure.step=false",
        "measure.memory=false",
        "measure.approx_error=false",
        "measure.speedup_vs=[sdpa,math]",
    )
    built = measure.setup(config)
    references = []
    build = variants.build_attention

    def recorded(name, **options):
        references.append((name, options))
        return build(name, **options)

    monkeypatch.setattr(variants, "build_attention", recorded)
    columns = measure.measure(config, built)
    # A bidirectional kernel against bidirectional exact attention: SDPA forward, then SDPA
    # and the O(L²) form forward+backward.
    assert references == [
        ("full", {"causal": False, "impl": "sdpa"}),
        ("full", {"causal": False, "impl": "sdpa"}),
        ("full", {"causal": False, "impl": "math"}),
    ]
    assert columns["speedup_rounds"] == config.measure.rounds == 5
    for name in ("speedup_vs_sdpa", "fwd_speedup_vs_sdpa", "speedup_vs_math"):
        assert math.isfinite(columns[name]) and columns[name] > 0, name
        assert columns[f"{name}_iqr"] >= 0 and record.column(name) is not None
    assert columns["attn_fwd_ms"] > 0 and columns["attn_fwd_bwd_ms"] > 0


def test_setup_rejects_an_unknown_speedup_reference(job_config):
    with pytest.raises(ValueError, match=r"'measure.speedup_vs' must list .* sdpa, math"):
        measure.setup(job_config(*TINY, "measure.speedup_vs=[flash]"))


@pytest.mark.parametrize(
    "override",
    [
        "measure.rounds=0",
        "measure.approx_seeds=0",
        "train.eval_batches=0",
        "measure.matmul_size=0",
        "train.steps=-1",
    ],
)
def test_setup_rejects_non_positive_measurement_sizes(job_config, override):
    with pytest.raises(ValueError, match=override.split("=")[0].split(".")[-1]):
        measure.setup(job_config(*TINY, override))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_resolve_device_without_a_gpu():
    assert measure.resolve_device("auto") == CPU
    with pytest.raises(ValueError, match="cuda"):
        measure.resolve_device("cuda")


def test_time_call_returns_a_positive_median_after_warmup():
    calls = []

    def nap():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    measured = timing.time_call(nap, CPU, min_run_time_s=0.05, warmup=3)
    assert 1.5 < measured.median_ms < 100 and 0 <= measured.iqr_ms < 100  # ~2 ms, busy machine
    assert len(calls) > 3 + timing.MIN_BLOCKS  # the warm-up calls, then the timed ones


class ScriptedKernel:
    """A stub kernel on a scripted clock: call i "takes" durations[i] seconds (the last one
    repeats), so a timing is exact and costs no real time."""

    def __init__(self, *durations: float):
        self.durations, self.now, self.calls = list(durations), 0.0, 0

    def __call__(self) -> None:
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1

    def clock(self) -> float:
        return self.now


def scripted_time(kernel: ScriptedKernel, min_run_time_s: float = 0.0, warmup: int = 1):
    return timing.time_call(
        kernel, CPU, min_run_time_s=min_run_time_s, warmup=warmup, clock=kernel.clock
    )


def test_one_stalled_call_moves_a_block_not_the_median():
    # The smoke sweep's outlier: a 1.7 ms kernel whose first timed call stalled for 55 ms.
    # One warm-up call, one sizing call, then blocks of 10 calls: the stall lands in a block.
    kernel = ScriptedKernel(1.7e-3, 1.7e-3, 55e-3, *[1.7e-3] * 100)
    measured = scripted_time(kernel, min_run_time_s=0.05)
    assert measured.blocks >= timing.MIN_BLOCKS and measured.calls_per_block == 10
    assert measured.median_ms == pytest.approx(1.7)
    assert timing.spread_warnings({"attn_fwd_bwd_ms": measured}) is None


def test_a_long_call_is_still_timed_in_five_blocks_whatever_the_budget():
    kernel = ScriptedKernel(10.0)  # 10 s a call, a budget of a fraction of one call
    measured = scripted_time(kernel, min_run_time_s=0.3, warmup=0)
    assert (measured.blocks, measured.calls_per_block, kernel.calls) == (5, 1, 5)
    assert (measured.median_ms, measured.iqr_ms) == (10_000.0, 0.0)


def test_a_widely_spread_figure_is_flagged():
    kernel = ScriptedKernel(*[0.02, 0.06] * 10)  # blocks alternate between 20 and 60 ms
    measured = scripted_time(kernel, warmup=0)
    assert measured.blocks == timing.MIN_BLOCKS and measured.spread > timing.SPREAD_WARNING
    warning = timing.spread_warnings(
        {"step_ms": measured, "attn_fwd_ms": scripted_time(ScriptedKernel(0.02), warmup=0)}
    )
    assert warning.startswith("step_ms IQR") and "attn_fwd_ms" not in warning


def test_matmul_rate_is_positive_and_measured_afresh():
    assert timing.matmul_gflops_per_s("cpu", torch.float32, 64) > 0
    assert not hasattr(timing.matmul_timing, "cache_info")  # never one rate per process


def test_nothing_timed_no_matmul_rate(job_config):
    config = job_config(*TINY, "train.steps=0", *conftest.MEASURE_NOTHING)
    columns = measure.measure(config, measure.setup(config))
    assert columns["matmul_peak_gflops_per_s"] is None and columns["timing_warning"] is None


def test_a_float16_job_checks_its_gradients_every_step_and_records_a_warning(
    job_config, monkeypatch
):
    from experiments.training import train

    checked, real_check = [], train.GradientCheck.check

    def check(self, parameters, step):
        checked.append((step, self.scaler is not None))
        real_check(self, parameters, step)
        if step == 1:
            self.zero_steps.append(step)  # as if this step's gradients had underflowed

    monkeypatch.setattr(train.GradientCheck, "check", check)
    config = job_config(*TINY, "dtype=float16", *conftest.MEASURE_NOTHING)
    columns = measure.measure(config, measure.setup(config))
    assert checked == [(0, True), (1, True)]  # every step, with a loss scaler (CPU too)
    assert columns["precision"] == "fp16-mixed" and math.isfinite(columns["eval_loss"])
    assert "all zero (underflow) at 1 of 2 steps, first at step 1" in columns["grad_warning"]
    float32 = job_config(*TINY, *conftest.MEASURE_NOTHING)
    checked.clear()
    assert "grad_warning" not in measure.measure(float32, measure.setup(float32)) and not checked


@pytest.mark.parametrize("attention", ["linformer", "full"])
def test_the_kernels_peak_memory_is_the_same_in_its_first_measured_call_and_later(
    job_config, attention
):
    """As measure() takes it: a step measured first, the kernel's warm-up call, then its
    forward+backward. Its gradients were freed at the start of each call, at a size the profiler
    knew only if an earlier profiling had seen them allocated: Linformer's peak at 1024 was
    4.46 MB in the first call and 1.31 MB in every later one."""
    config = job_config(*TINY, "seq_len=256", f"attention={attention}", "model.causal=false")
    built = measure.setup(config)
    shape = measure.kernel_shape(config, built.model)
    _, fwd_bwd = kernel_rounds.kernel_calls(built.kernel, shape, CPU, torch.float32)
    step = measure.training_step(built.model, built.task, CPU)
    step()
    peak_memory_bytes(step)
    fwd_bwd()
    peaks = [peak_memory_bytes(fwd_bwd) for _ in range(3)]
    grads = 3 * math.prod(shape) * 4 + sum(p.numel() * 4 for p in built.kernel.parameters())
    assert peaks == [peaks[0]] * 3 and peaks[0] >= grads  # the inputs' and the kernel's grads
