"""Every fixed pattern's forward (no grad) against compiled FlexAttention with the block mask of
the same pattern (`impl=flex`, up to `--flex-max-len`; each length and pattern compiles once,
~30 s, in the untimed first call)."""

from __future__ import annotations

import statistics

from benchmarks.targets.call_timing import forward, time_in_rounds, yardstick
from benchmarks.targets.kernels import kernel
from benchmarks.targets.table import Target, at_least

# Forward (no grad) of each fixed pattern, ours against compiled FlexAttention on its pattern.
FLEX_KERNELS = ("blockwise", "strided", "longformer", "bigbird", "sparse_fixed")
FLEX_MAX_LENGTH = 16384


def flex_targets(lengths: list[int], rounds: int, min_seconds: float = 0.0) -> list[Target]:
    """Forward (no grad) of each FLEX_KERNELS pattern: compiled FlexAttention's time with the
    block mask of the same pattern over ours, in the same rounds; above 1 means ours is
    faster."""
    rows = []
    for length in lengths:
        calls = {
            f"{name} {impl}": forward(kernel(name, length, impl=impl), length)
            for name in FLEX_KERNELS
            for impl in ("native", "flex")
        }
        times, _ = time_in_rounds(calls, rounds, yardstick(), min_seconds)
        for name in FLEX_KERNELS:
            pairs = zip(times[f"{name} flex"], times[f"{name} native"], strict=True)
            ratio = statistics.median(flex / ours for flex, ours in pairs)
            rows.append(at_least(f"compiled flex fwd / {name} fwd, L={length}", ratio, 1.0))
        print(
            f"L={length} forward seconds: "
            + ", ".join(f"{k} {statistics.median(t):.3g}" for k, t in times.items()),
            flush=True,
        )
    return rows
