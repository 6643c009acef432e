"""Wall-clock timing of one call, the same way for every variant: median and IQR over blocks.

A block repeats the call until it lasts `BLOCK_MIN_S` (as `torch.utils.benchmark`'s
`blocked_autorange`, so the clock's resolution and the loop's overhead do not count), and there
are at least `MIN_BLOCKS` blocks whatever `min_run_time_s` is: one stalled call on a busy machine
then moves one block, not the median. A figure whose blocks spread widely is flagged.

A ratio of two calls' times (a kernel against exact attention) is taken in rounds that time each
contender once in turn (`time_in_rounds`), as the median of the per-round ratios (`ratio`): a
change in the machine's load between rounds moves both times of a round alike and cancels. The
machine's matmul rate, which achieved FLOP/s are divided by, is such a contender too (the
`yardstick` of `timed_against`): timed in the kernel's own rounds, never once per process, so a
worker whose first matmul ran while the machine was busy cannot lend that rate to later jobs.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

MIN_BLOCKS = 5
BLOCK_MIN_S = 0.01
MAX_CALLS_PER_BLOCK = 10**6
SPREAD_WARNING = 0.5  # flag a figure whose IQR is more than this fraction of its median
# Flag a FLOP fraction above this: a kernel's useful FLOP/s cannot beat the matmul's by more
# than the two timings' noise, so past it one of them is off (a stall, a load change).
FRACTION_WARNING = 1.05
YARDSTICK_S = 0.03  # the matmul's time budget per round: a few calls, the median of them


@dataclass(frozen=True)
class Timing:
    """One call's time: the median and interquartile range over `blocks` timed blocks (ms).

    A figure taken in rounds (`timed_against`) has one block per round, each that round's own
    median, and `calls_per_block` 0."""

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
    q1, median, q3 = quartiles(per_call)
    return Timing(median * 1e3, (q3 - q1) * 1e3, len(per_call), calls)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `values` (inclusive method; one value is all
    three)."""
    if len(values) > 1:
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return q1, median, q3
    return values[0], values[0], values[0]


def time_in_rounds(
    calls: Mapping[str, Callable[[], object]],
    rounds: int,
    time_one: Callable[[Callable[[], object]], float],
    *,
    yardstick: Callable[[], object] | None = None,
    min_seconds: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per call of every contender, once per round in the order of `calls` (a, b, c,
    a, b, c, ...), each measured by `time_one(fn)` -> seconds per call. At least `rounds`
    rounds, and more until `min_seconds` of `clock` have passed.

    With a `yardstick` (the benchmark script's matmul), it is timed before the first contender
    and after each, and each contender gets the geometric mean of the yardstick just before and
    just after it, so its time can be read in units of the machine's speed at that moment.
    Returns (times, yardsticks), each {name: one value per round}; yardsticks is empty lists
    without a yardstick.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    yardsticks: dict[str, list[float]] = {name: [] for name in calls}
    start = clock()
    done = 0
    while done < rounds or clock() - start < min_seconds:
        done += 1
        before = time_one(yardstick) if yardstick is not None else None
        for name, fn in calls.items():
            times[name].append(time_one(fn))
            if yardstick is not None:
                after = time_one(yardstick)
                yardsticks[name].append(math.sqrt(before * after))
                before = after
    return times, yardsticks


@dataclass(frozen=True)
class Ratio:
    """A speed-up: the median over rounds of reference time / contender time in the same round
    (above 1: the contender is faster), and the interquartile range of those ratios."""

    median: float
    iqr: float
    rounds: int


def ratio(reference: Sequence[float], contender: Sequence[float]) -> Ratio:
    """The per-round ratios reference[i] / contender[i] summarised as a `Ratio`; the two lists
    are one time per round of the same rounds (`time_in_rounds`)."""
    per_round = [r / c for r, c in zip(reference, contender, strict=True)]
    q1, median, q3 = quartiles(per_round)
    return Ratio(median, q3 - q1, len(per_round))


def round_timer(
    device: torch.device,
    *,
    min_run_time_s: float,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[Callable[[], object]], float]:
    """How one contender is timed in one round: `time_call`, with `warmup` untimed calls the
    first time this timer sees the contender (its lazy set-up: caches, buckets, first-touch
    pages) and none in later rounds, then blocks until `min_run_time_s` is spent, one block at
    least; seconds per call, the blocks' median.

    Why not warm up every round: at long lengths one call of the O(L²) form is longer than a
    round's time, so a per-round warm-up doubled what the rounds cost, and a switch between
    kernels re-does no set-up (on CPU every large buffer is allocated afresh on every call
    anyway: glibc maps and unmaps it)."""
    seen: list[Callable[[], object]] = []  # kept alive, so an id is never reused

    def time_one(fn: Callable[[], object]) -> float:
        first = not any(fn is other for other in seen)
        if first:
            seen.append(fn)
        timing = time_call(
            fn,
            device,
            min_run_time_s=min_run_time_s,
            warmup=warmup if first else 0,
            min_blocks=1,
            clock=clock,
        )
        return timing.median_ms / 1e3

    return time_one


@dataclass(frozen=True)
class Yardstick:
    """The matmul timed in a kernel's rounds: its time per call (median and IQR over rounds)
    and, per round, the matmul's time over the kernel's (`ratio`), the kernel's speed in
    units of the machine's at that moment."""

    timing: Timing
    per_kernel: Ratio


YARDSTICK = "matmul"  # the yardstick's name among a round's contenders


def timed_against(
    mine: Callable[[], object],
    references: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    time_one: Callable[[Callable[[], object]], float],
    yardstick: Callable[[], object] | None = None,
    time_yardstick: Callable[[Callable[[], object]], float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Timing, dict[str, Ratio], Yardstick | None]:
    """`mine` and each of `references` timed in `rounds` alternating rounds (mine, ref 1,
    ref 2, mine, ref 1, ...; `time_one` per call, e.g. `round_timer`). Returns mine's time
    (median and IQR over the rounds), per reference the speed-up reference / mine and, with a
    `yardstick` (`matmul_call`), the yardstick timed right after mine in every round
    (`time_yardstick`, default `time_one`), else None."""
    calls = {"": mine}
    if yardstick is not None:
        calls[YARDSTICK] = yardstick
    calls.update(references)
    timer_of_yardstick = time_yardstick or time_one

    def timed(fn: Callable[[], object]) -> float:
        return timer_of_yardstick(fn) if fn is yardstick else time_one(fn)

    times, _ = time_in_rounds(calls, rounds, timed, clock=clock)
    own = _over_rounds(times[""])
    measured = None
    if yardstick is not None:
        measured = Yardstick(_over_rounds(times[YARDSTICK]), ratio(times[YARDSTICK], times[""]))
    return own, {name: ratio(times[name], times[""]) for name in references}, measured


def _over_rounds(seconds: Sequence[float]) -> Timing:
    """One time per round (seconds) as a `Timing` in ms: one block per round."""
    q1, median, q3 = quartiles(seconds)
    return Timing(median * 1e3, (q3 - q1) * 1e3, len(seconds), 0)


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


def matmul_timing(device: str, dtype: torch.dtype, size: int = 1024) -> Timing:
    """The time of one `size` x `size` matmul for `dtype` on `device`, measured now (0.3 s).
    Not cached: a job's FLOP fraction takes its matmul from its own rounds (`timed_against`);
    this is for a banner (benchmarks/targets/__main__.py)."""
    dev = torch.device(device)
    return time_call(matmul_call(size, dev, dtype), dev, min_run_time_s=0.3, warmup=2)


def matmul_flops(size: int) -> int:
    """FLOPs of one `size` x `size` matmul (`matmul_call`)."""
    return 2 * size**3


def matmul_gflops_per_s(device: str, dtype: torch.dtype, size: int = 1024) -> float:
    """The machine's dense matmul rate (GFLOP/s) for `dtype` on `device`, measured now.

    The yardstick for achieved FLOP/s: attention is matmul-bound, so a variant's useful FLOP/s
    over this rate says how close it runs to what the hardware gives.
    """
    return matmul_flops(size) / (matmul_timing(device, dtype, size).median_ms * 1e-3) / 1e9
