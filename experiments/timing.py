"""Wall-clock timing with torch.utils.benchmark, the same way for every variant."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.utils import benchmark


def time_ms(
    fn: Callable[[], object], device: torch.device, *, min_run_time_s: float, warmup: int
) -> tuple[float, float]:
    """Median and interquartile range of one call of `fn`, in milliseconds.

    `warmup` untimed calls first (allocator, caches, lazy init); then `blocked_autorange`, which
    synchronises CUDA around each block and repeats until `min_run_time_s` has been spent (at
    least one measured block, so a 10 s call costs ~10 s, not 10 x 10 s).
    """
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time_s)
    return m.median * 1e3, m.iqr * 1e3


@functools.cache
def matmul_gflops_per_s(device: str, dtype: torch.dtype, size: int = 1024) -> float:
    """The machine's dense matmul rate (GFLOP/s) for `dtype` on `device`, measured once per process.

    The yardstick for achieved FLOP/s: attention is matmul-bound, so a variant's useful FLOP/s
    over this rate says how close it runs to what the hardware gives.
    """
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    median_ms, _ = time_ms(lambda: a @ b, dev, min_run_time_s=0.3, warmup=2)
    return 2 * size**3 / (median_ms * 1e-3) / 1e9
