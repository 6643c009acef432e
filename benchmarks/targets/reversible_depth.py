"""The reversible depth ratios: a reversible model's peak memory at depth 12 over depth 1, and
its step time over a residual model's at depth 12."""

from __future__ import annotations

import statistics

from benchmarks.targets.call_timing import seconds_per_call
from benchmarks.targets.kernels import model, shape, training_step
from benchmarks.targets.table import Target, at_most
from experiments.measurement.memory import peak_memory_bytes


def depth_targets(length: int, attention: str, rounds: int) -> list[Target]:
    """Reversible depth-12 / depth-1 peak memory, and reversible / residual step time at 12."""
    peaks = {
        depth: peak_memory_bytes(
            training_step(model(attention, length, depth, "reversible"), length), shape().device
        )
        for depth in (1, 12)
    }
    steps = {
        block: training_step(model(attention, length, 12, block), length)
        for block in ("residual", "reversible")
    }
    ratios = []
    for _ in range(rounds):
        residual = seconds_per_call(steps["residual"], min_time_s=0)
        reversible = seconds_per_call(steps["reversible"], min_time_s=0)
        ratios.append(reversible / residual)
    where = f"{attention}, L={length}"
    return [
        at_most(f"reversible peak memory depth 12 / depth 1 ({where})", peaks[12] / peaks[1], 1.3),
        at_most(
            f"reversible / residual step time, depth 12 ({where})", statistics.median(ratios), 1.6
        ),
    ]
