"""Wall-clock timing of one call, the same way for every variant: median and IQR over blocks.

A block repeats the call until it lasts `BLOCK_MIN_S` (as `torch.utils.benchmark`'s
`blocked_autorange`, so the clock's resolution and the loop's overhead do not count), and there
are at least `MIN_BLOCKS` blocks whatever `min_run_time_s` is: one stalled call on a busy machine
then moves one block, not the median. A figure whose blocks spread widely is flagged.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

MIN_BLOCKS = 5
BLOCK_MIN_S = 0.01
MAX_CALLS_PER_BLOCK = 10**6
SPREAD_WARNING = 0.5  # flag a figure whose IQR is more than this fraction of its median


@dataclass(frozen=True)
class Timing:
    """One call's time: the median and interquartile range over `blocks` timed blocks (ms)."""

    median_ms: float
    iqr_ms: float
    blocks: int
    calls_per_block: int

    @property
    def spread(self) -> float:
        """IQR / median: 0 for a steady figure."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    *,
    min_run_time_s: float,
    warmup: int,
    min_blocks: int = MIN_BLOCKS,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time one call of `fn`: `warmup` untimed calls, then blocks until there are `min_blocks`
    of them and `min_run_time_s` seconds are spent. CUDA is synchronised around each block;
    garbage collection is off inside blocks (as `timeit`). `clock` (seconds) is for tests."""
    for _ in range(warmup):
        fn()

    def block(calls: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        collecting = gc.isenabled()
        gc.disable()
        try:
            start = clock()
            for _ in range(calls):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return clock() - start
        finally:
            if collecting:
                gc.enable()

    calls, seconds = 1, block(1)
    while seconds < BLOCK_MIN_S and calls < MAX_CALLS_PER_BLOCK:  # size the blocks
        calls *= 10
        seconds = block(calls)
    per_call, spent = [seconds / calls], seconds  # the last sizing block is a full block
    while len(per_call) < min_blocks or spent < min_run_time_s:
        seconds = block(calls)
        per_call.append(seconds / calls)
        spent += seconds
    if len(per_call) > 1:
        q1, median, q3 = statistics.quantiles(per_call, n=4, method="inclusive")
    else:
        q1 = median = q3 = per_call[0]
    return Timing(median * 1e3, (q3 - q1) * 1e3, len(per_call), calls)


def spread_warnings(timings: Mapping[str, Timing], limit: float = SPREAD_WARNING) -> str | None:
    """One line naming each figure whose IQR exceeds `limit` × its median, or None if none."""
    noisy = [
        f"{name} IQR {t.spread:.0%} of its median over {t.blocks} blocks"
        for name, t in timings.items()
        if t.spread > limit
    ]
    return "; ".join(noisy) or None


def matmul_call(
    size: int = 1024, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Callable[[], object]:
    """The machine's yardstick: a call of one dense `size` x `size` matmul (2 size^3 FLOPs)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return lambda: a @ b


@functools.cache
def matmul_timing(device: str, dtype: torch.dtype, size: int = 1024) -> Timing:
    """The time of one `size` x `size` matmul for `dtype` on `device`, measured once per process
    (its spread is flagged with the job's other timings)."""
    dev = torch.device(device)
    return time_call(matmul_call(size, dev, dtype), dev, min_run_time_s=0.3, warmup=2)


def matmul_gflops_per_s(device: str, dtype: torch.dtype, size: int = 1024) -> float:
    """The machine's dense matmul rate (GFLOP/s) for `dtype` on `device`, measured once per process.

    The yardstick for achieved FLOP/s: attention is matmul-bound, so a variant's useful FLOP/s
    over this rate says how close it runs to what the hardware gives.
    """
    return 2 * size**3 / (matmul_timing(device, dtype, size).median_ms * 1e-3) / 1e9
