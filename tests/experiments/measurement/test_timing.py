"""Timing in alternating rounds: the order of the calls and the median of per-round ratios,
on a scripted clock (no real time is measured)."""

from __future__ import annotations

import pytest
import torch

from experiments.measurement import timing

CPU = torch.device("cpu")


class Machine:
    """A scripted clock: each contender's call "takes" its base seconds times the machine's
    current load, and every call is logged by name."""

    def __init__(self):
        self.now, self.load, self.log = 0.0, 1.0, []

    def contender(self, name: str, seconds: float):
        def call():
            self.now += seconds * self.load
            self.log.append(name)

        return call

    def clock(self) -> float:
        return self.now


def runs(log: list[str]) -> list[str]:
    """The log with repeated neighbours folded: the order contenders took turns in."""
    return [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]


def test_rounds_alternate_the_kernel_with_each_reference():
    machine = Machine()
    kernel = machine.contender("kernel", 2e-3)
    references = {"sdpa": machine.contender("sdpa", 1e-3), "math": machine.contender("math", 4e-3)}
    time_one = timing.round_timer(CPU, min_run_time_s=0.0, warmup=1, clock=machine.clock)
    own, ratios, _ = timing.timed_against(
        kernel, references, rounds=5, time_one=time_one, clock=machine.clock
    )
    assert runs(machine.log) == ["kernel", "sdpa", "math"] * 5
    # The first round: one warm-up call, a sizing call, then a block of 10 (>= 10 ms); later
    # rounds: no warm-up, so a sizing call and a block of 10.
    assert machine.log[:12] == ["kernel"] * 12 and machine.log[12] == "sdpa"
    assert machine.log.count("kernel") == 12 + 4 * 11
    assert own.median_ms == pytest.approx(2.0) and own.iqr_ms == pytest.approx(0.0)
    assert own.blocks == 5
    assert ratios["sdpa"].median == pytest.approx(0.5) and ratios["math"].median == pytest.approx(2)
    assert ratios["sdpa"].rounds == 5


def test_a_load_change_between_rounds_moves_the_times_but_not_the_ratio():
    machine = Machine()
    kernel = machine.contender("kernel", 2e-3)
    sdpa = machine.contender("sdpa", 4e-3)
    loads = iter([1.0, 1.0, 3.0, 3.0, 3.0])  # another process takes the cores after round 2
    timer = timing.round_timer(CPU, min_run_time_s=0.0, warmup=1, clock=machine.clock)

    def time_one(fn):
        if fn is kernel:  # each round starts with the kernel
            machine.load = next(loads)
        return timer(fn)

    own, ratios, _ = timing.timed_against(
        kernel, {"sdpa": sdpa}, rounds=5, time_one=time_one, clock=machine.clock
    )
    assert own.median_ms == pytest.approx(6.0) and own.iqr_ms == pytest.approx(4.0)
    assert ratios["sdpa"].median == pytest.approx(2.0) and ratios["sdpa"].iqr == pytest.approx(0)


def test_the_ratio_is_the_median_of_per_round_ratios_with_their_iqr():
    # Round ratios 1, 4, 3, 2, 5: median 3, quartiles 2 and 4 (inclusive).
    measured = timing.ratio([1.0, 8.0, 3.0, 2.0, 10.0], [1.0, 2.0, 1.0, 1.0, 2.0])
    assert (measured.median, measured.iqr, measured.rounds) == (3.0, 2.0, 5)
    # Not the ratio of the medians, which would be 9 / 1 here.
    skewed = timing.ratio([1.0, 1.0, 9.0, 9.0, 9.0], [1.0, 1.0, 9.0, 9.0, 1.0])
    assert skewed.median == 1.0
    with pytest.raises(ValueError):
        timing.ratio([1.0, 2.0], [1.0])  # rounds must pair up


def test_rounds_continue_until_the_minimum_time_is_spent():
    machine = Machine()
    calls = {"a": machine.contender("a", 1.0)}
    times, yardsticks = timing.time_in_rounds(
        calls, 2, lambda fn: fn() or 1.0, min_seconds=3.5, clock=machine.clock
    )
    assert len(times["a"]) == 4 and yardsticks == {"a": []}
