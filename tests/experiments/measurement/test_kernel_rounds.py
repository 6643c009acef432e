"""FLOP fractions from the kernel's own rounds: the matmul is timed beside the kernel in every
job, never once per worker process. On a scripted clock (no real time is measured)."""

from __future__ import annotations

import pytest
import torch

import variants
from experiments.job_config import MeasureConfig
from experiments.measurement import kernel_rounds, timing
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR

CPU = torch.device("cpu")
SHAPE = (1, 2, 128, 16)  # (B, H, L, D)
SIZE = 64  # the matmul's size: 2 * 64^3 FLOPs a call
MATMUL_S = 1e-3  # a matmul call on a quiet machine
M_CFG = MeasureConfig(
    kernel=True,
    step=False,
    memory=False,
    min_run_time_s=0.05,
    warmup=1,
    approx_error=False,
    approx_seeds=1,
    reference={},
    matmul_size=SIZE,
)


class Worker:
    """One worker process's scripted clock: each call advances it by its seconds; the matmul
    takes `matmul_load` times its quiet time (another process on the cores)."""

    def __init__(self):
        self.now, self.matmul_load = 0.0, 1.0

    def clock(self) -> float:
        return self.now

    def call(self, seconds: float):
        def run():
            self.now += seconds

        return run

    def matmul_call(self, size, device, dtype):
        def run():
            self.now += MATMUL_S * self.matmul_load

        return run


def kernel_seconds(kernel, fraction: float) -> float:
    """The forward+backward time at which `kernel` runs at `fraction` of the quiet matmul."""
    flops = kernel.flops(*SHAPE) * FWD_BWD_FLOP_FACTOR
    return flops / (fraction * 2 * SIZE**3 / MATMUL_S)


def job(worker: Worker, kernel) -> dict:
    """One job's rounds in `worker`: the kernel, SDPA and the matmul, scripted."""
    fwd, fwd_bwd = worker.call(1e-3), worker.call(kernel_seconds(kernel, 0.5))
    _, columns = kernel_rounds.round_timings(
        kernel, fwd, fwd_bwd, SHAPE, CPU, torch.float32, M_CFG, clock=worker.clock
    )
    return columns


@pytest.fixture
def scripted(monkeypatch):
    """Runs the jobs in `worker`: its matmul and exact attention's calls (2 ms) scripted."""

    def on(worker: Worker) -> None:
        sdpa = (worker.call(2e-3), worker.call(2e-3))
        monkeypatch.setattr(kernel_rounds, "kernel_calls", lambda exact, *args: sdpa)
        monkeypatch.setattr(kernel_rounds, "matmul_call", worker.matmul_call)

    return on


def test_a_slow_first_matmul_in_a_worker_does_not_move_another_jobs_fraction(scripted):
    kernel = variants.build_attention("full")
    busy = Worker()
    scripted(busy)
    busy.matmul_load = 4.0  # the worker's first job: its matmul ran while the cores were busy
    first = job(busy, kernel)
    busy.matmul_load = 1.0
    second = job(busy, kernel)
    quiet = Worker()
    scripted(quiet)
    alone = job(quiet, kernel)  # the same job as the first of a fresh worker
    assert alone["attn_fwd_bwd_matmul_fraction"] == pytest.approx(0.5)
    assert second["attn_fwd_bwd_matmul_fraction"] == pytest.approx(0.5)
    assert second["matmul_peak_gflops_per_s"] == pytest.approx(alone["matmul_peak_gflops_per_s"])
    assert not second["matmul_fraction_warning"] and "_matmul_warning" not in second
    # The busy job itself: 4 times the machine's matmul, which no kernel does: flagged.
    assert first["attn_fwd_bwd_matmul_fraction"] == pytest.approx(2.0)
    assert first["matmul_fraction_warning"] is True
    assert "attn_fwd_bwd_matmul_fraction 2.00 > 1.05" in first["_matmul_warning"]


def test_the_matmul_is_timed_right_after_the_kernel_in_every_round():
    log = []

    def contender(name):
        return lambda: log.append(name)

    _, _, matmul = timing.timed_against(
        contender("kernel"),
        {"sdpa": contender("sdpa")},
        rounds=3,
        time_one=lambda fn: fn() or 1.0,
        yardstick=contender("matmul"),
        time_yardstick=lambda fn: fn() or 0.5,
    )
    assert log == ["kernel", "matmul", "sdpa"] * 3
    assert matmul.timing.median_ms == pytest.approx(500) and matmul.per_kernel.median == 0.5


def test_a_widely_spread_matmul_is_flagged_like_every_timing():
    """The matmul every achieved rate is divided by is a timing like the others."""
    noisy = timing.Yardstick(
        timing.Timing(median_ms=1.0, iqr_ms=0.9, blocks=5, calls_per_block=0),
        timing.Ratio(0.1, 0.0, 5),
    )
    kernel = variants.build_attention("full")
    columns = kernel_rounds.fraction_columns(kernel, SHAPE, noisy, SIZE, prefix="fwd_")
    assert columns["_matmul_warning"] == (
        "matmul_peak_gflops_per_s IQR 90% of its median over 5 rounds"
    )
