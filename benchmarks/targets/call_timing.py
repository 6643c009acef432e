"""How the targets time a call: the kernel calls on fixed random inputs (forward+backward, or
forward alone), each timed after one untimed call, and the contenders timed once per round in
turn, next to the 1024^3 matmul yardstick (`experiments.measurement.timing`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.targets.kernels import shape
from experiments.measurement import timing as measurement_timing
from experiments.measurement.timing import matmul_call, time_call
from variants.attention.common.base import sample_gates

YARDSTICK = 1024  # the matmul timed around each call: YARDSTICK^3, in the run's dtype


def forward_backward(attend: Callable, length: int) -> Callable[[], object]:
    """A call of attend(q, k, v) forward and backward to q, k, v, on fixed random inputs of
    `shape()`."""
    q, k, v = (shape().randn(length, requires_grad=True) for _ in range(3))
    grad_out = shape().randn(length)
    gates = _gates(attend, q)

    def call():
        out = attend(q, k, v, **gates)  # (B, H, L, D)
        return torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)

    return call


def forward(attend: Callable, length: int) -> Callable[[], object]:
    """A call of attend(q, k, v) without autograd, on fixed random inputs of `shape()`."""
    q, k, v = (shape().randn(length) for _ in range(3))
    gates = _gates(attend, q)

    @torch.no_grad()
    def call():
        return attend(q, k, v, **gates)

    return call


def _gates(attend: Callable, q: torch.Tensor) -> dict:
    """{"gates": sigmoid(N(0, 1))} for a gated registry kernel (NSA, DeltaNet), else {}."""
    if not getattr(attend, "n_gates", 0):
        return {}
    return {"gates": sample_gates(attend, q)}


def seconds_per_call(fn: Callable[[], object], min_time_s: float = 0.3) -> float:
    """Seconds of one call, timed for at least `min_time_s` (at least one call) after one
    untimed call: `experiments.measurement.timing.time_call` with one block at the least, so a call
    of seconds is timed once and a short one over blocks of calls (the median block).

    The untimed call matters for every contender alike: the first call after another kernel's
    measured up to 2x slower for allocation-heavy kernels (LSH at 16K: 2.2 s after an SDPA call,
    1.07 s after its own), as glibc hands freed memory back and fresh pages fault in again.
    """
    timing = time_call(fn, shape().device, min_run_time_s=min_time_s, warmup=1, min_blocks=1)
    return timing.median_ms / 1e3


def yardstick() -> Callable[[], object]:
    """The YARDSTICK^3 matmul in `shape()`'s dtype on its device."""
    return matmul_call(YARDSTICK, shape().device, shape().dtype)


def time_in_rounds(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    yardstick: Callable[[], object],
    min_seconds: float = 0.0,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per call of every contender, once per round in turn, and of the yardstick around
    each: the geometric mean of its time just before and just after the contender's. At least
    `rounds` rounds, and more until `min_seconds` have passed: where rounds are cheap (4K: ~8 s)
    the medians get more of them. `full` and SDPA run the same kernel, yet their ratio's median
    over 3 rounds ranged 0.97-1.21 at 4K (7 groups of 3 of 21 rounds); over all 21 it was 1.02.

    The machine's speed drifts within a minute (LSH at 32K took 1.35-1.94 s in four profiles
    minutes apart, the matmul 131-166 GFLOP/s): a contender measured against one matmul per
    round took that drift into its FLOP fraction: at 32K, LSH's call came after `full`'s
    (16-18 s) and later contenders' up to ~50 s after that matmul.
    `experiments.measurement.timing.time_in_rounds`, each call timed by `seconds_per_call`.
    Returns (times, yardsticks), each {name: one value per round}.
    """
    return measurement_timing.time_in_rounds(
        calls,
        rounds,
        lambda fn: seconds_per_call(fn),  # looked up per call: tests substitute it
        yardstick=yardstick,
        min_seconds=min_seconds,
        clock=lambda: time.perf_counter(),
    )
