"""The attention kernel timed alone: its inputs, its forward and forward+backward in rounds that
alternate with exact attention and the machine's matmul, and the columns they give (medians,
IQRs, speedups, the matmul rate and the kernel's FLOP fraction of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

import variants
from experiments.job_config import MeasureConfig
from experiments.measurement.timing import (
    FRACTION_WARNING,
    SPREAD_WARNING,
    YARDSTICK_S,
    Timing,
    matmul_call,
    matmul_flops,
    round_timer,
    timed_against,
)
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR, Attention, sample_gates


def kernel_calls(
    kernel, shape, device, dtype, kv_heads: int | None = None
) -> tuple[Callable, Callable | None]:
    """The kernel alone on random q of `shape` and k, v of `kv_heads` heads (default q's):
    a forward (no grad) and, unless the kernel runs forward only on `device` (impl=flex on
    CPU), a forward+backward that also allocates the inputs' gradients, as a training step
    does, and releases them (and the kernel's parameters' gradients) before it returns."""
    kv_shape = (shape[0], shape[1] if kv_heads is None else kv_heads, *shape[2:])
    q = torch.randn(shape, device=device, dtype=dtype)
    k, v = (torch.randn(kv_shape, device=device, dtype=dtype) for _ in range(2))
    gates = sample_gates(kernel, q)  # None unless the kernel is gated (NSA, DeltaNet)

    def fwd():
        with torch.no_grad():
            kernel(q, k, v, gates=gates)

    if not kernel.supports_backward(device):
        return fwd, None
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))  # k, v: (B, H_kv, L, D)
    grad_out = torch.randn(shape, device=device, dtype=dtype)

    def fwd_bwd():
        kernel(qg, kg, vg, gates=gates).backward(grad_out)
        # Released at the end, not the start: a call frees nothing that was live before it, so
        # its peak memory is the same quantity on CPU and CUDA (memory.py).
        for t in (qg, kg, vg):
            t.grad = None
        kernel.zero_grad(set_to_none=True)

    return fwd, fwd_bwd


def round_timings(
    kernel: Attention,
    fwd: Callable[[], None],
    fwd_bwd: Callable[[], None] | None,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
    m_cfg: MeasureConfig,
    clock: Callable[[], float] = time.perf_counter,
    kv_heads: int | None = None,
) -> tuple[dict[str, Timing], dict[str, Any]]:
    """The kernel's forward and forward+backward, each timed in `m_cfg.rounds` rounds that
    alternate with exact attention (`full`) at the same shape (batch, heads, seq_len,
    head_dim), device, dtype and threads: its `sdpa` form in both passes and every other
    `m_cfg.speedup_vs` form (`math`: explicit L×L scores) in forward+backward (none with
    `speedup_vs` empty); the last pass also with the machine's matmul (`m_cfg.matmul_size`,
    `YARDSTICK_S` per round) right after the kernel in every round.

    Exact attention is causal iff the kernel is, so a bidirectional job is compared with
    bidirectional SDPA. A shared-QK kernel (lsh, routing) is compared with plain SDPA of the
    same shape, not with shared-QK exact attention: the question is what the kernel costs
    against the fused kernel a model would otherwise call. Each round gives every contender
    `m_cfg.warmup` untimed calls the first time, then `m_cfg.min_run_time_s / m_cfg.rounds`
    seconds (one block at least). Returns the kernel's timings (`attn_fwd_ms`,
    `attn_fwd_bwd_ms`: median and IQR over rounds) and the columns `[fwd_]speedup_vs_<impl>`
    (median over rounds of exact's time / the kernel's in the same round), their `_iqr`,
    `speedup_rounds`, `matmul_peak_gflops_per_s` (the matmul's median over rounds),
    `attn_fwd_bwd_matmul_fraction` (median over rounds of the kernel's useful FLOP/s / the
    matmul's in that round) and `matmul_fraction_warning`. `clock` (seconds) is for tests.
    `kv_heads`: the heads of the kernel's k and v (grouped KV heads; default q's): exact
    attention runs on the same grouped inputs (SDPA's `enable_gqa`), as a model would call it.
    """
    time_one = round_timer(
        device,
        min_run_time_s=(m_cfg.min_run_time_s or 0.0) / m_cfg.rounds,
        warmup=m_cfg.warmup,
        clock=clock,
    )
    time_yardstick = round_timer(device, min_run_time_s=YARDSTICK_S, warmup=1, clock=clock)
    passes = [("attn_fwd_ms", "fwd_", fwd, [i for i in m_cfg.speedup_vs if i == "sdpa"])]
    if fwd_bwd is not None:
        passes.append(("attn_fwd_bwd_ms", "", fwd_bwd, list(m_cfg.speedup_vs)))
    timings: dict[str, Timing] = {}
    columns: dict[str, Any] = {"speedup_rounds": m_cfg.rounds} if m_cfg.speedup_vs else {}
    for number, (name, prefix, mine, impls) in enumerate(passes):
        references = {}
        for impl in impls:
            exact = variants.build_attention("full", causal=kernel.causal, impl=impl).to(device)
            exact_fwd, exact_fwd_bwd = kernel_calls(exact, shape, device, dtype, kv_heads)
            references[impl] = exact_fwd if prefix else exact_fwd_bwd
        # A fresh matmul in every job, timed in its rounds: no rate is kept across jobs.
        last = number == len(passes) - 1
        yardstick = matmul_call(m_cfg.matmul_size, device, dtype) if last else None
        timings[name], ratios, matmul = timed_against(
            mine,
            references,
            rounds=m_cfg.rounds,
            time_one=time_one,
            yardstick=yardstick,
            time_yardstick=time_yardstick,
            clock=clock,
        )
        for impl, r in ratios.items():
            columns[f"{prefix}speedup_vs_{impl}"] = r.median
            columns[f"{prefix}speedup_vs_{impl}_iqr"] = r.iqr
        if matmul is not None:
            columns.update(fraction_columns(kernel, shape, matmul, m_cfg.matmul_size, prefix))
    return timings, columns


def fraction_columns(kernel, shape, matmul, size: int, prefix: str) -> dict[str, Any]:
    """The matmul rate of the kernel's rounds (GFLOP/s) and, for forward+backward (`prefix`
    ""), the FLOP fraction: per round (kernel FLOPs / its time) / (matmul FLOPs / its time),
    which is the round's time ratio matmul / kernel times the FLOP ratio, so its median is that
    ratio's median scaled. A wide matmul spread or a fraction above `FRACTION_WARNING` leaves
    a warning in `_matmul_warning` (measure joins it into `timing_warning`)."""
    timing = matmul.timing
    columns: dict[str, Any] = {
        "matmul_peak_gflops_per_s": matmul_flops(size) / timing.median_ms / 1e6
    }
    notes = []
    if timing.spread > SPREAD_WARNING:
        notes.append(
            f"matmul_peak_gflops_per_s IQR {timing.spread:.0%} of its median over "
            f"{timing.blocks} rounds"
        )
    if not prefix:  # forward+backward: a forward-only kernel has no fraction
        flops = kernel.flops(*shape) * FWD_BWD_FLOP_FACTOR
        fraction = matmul.per_kernel.median * flops / matmul_flops(size)
        columns["attn_fwd_bwd_matmul_fraction"] = fraction
        columns["matmul_fraction_warning"] = bool(fraction > FRACTION_WARNING)
        if fraction > FRACTION_WARNING:
            notes.append(
                f"attn_fwd_bwd_matmul_fraction {fraction:.2f} > {FRACTION_WARNING} of the matmul "
                "timed in the same rounds: a kernel cannot outrun the machine's matmul"
            )
    if notes:
        columns["_matmul_warning"] = "; ".join(notes)
    return columns


def timing_columns(timings: dict[str, Timing]) -> dict[str, float]:
    """`<name>_ms` -> its median, and `<name>_iqr_ms` its interquartile range."""
    columns = {}
    for name, t in timings.items():
        columns[name], columns[name.removesuffix("_ms") + "_iqr_ms"] = t.median_ms, t.iqr_ms
    return columns
