"""Budgets: a memory cap that turns a huge allocation into an exception, and a wall-clock limit."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.measurement import budget

ROOT = Path(__file__).resolve().parents[3]  # the repo
CPU = torch.device("cpu")
HUGE = 2**28  # float32 elements: 1 GiB, far over the caps below


def test_memory_cap_turns_a_huge_allocation_into_an_oom_error_and_lifts_after():
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(Exception) as caught, budget.memory_cap(0.1, CPU):
        torch.empty(HUGE)  # address space only: nothing is touched, so only the cap can stop it
    assert budget.is_out_of_memory(caught.value), repr(caught.value)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    del caught
    assert torch.empty(HUGE).numel() == HUGE  # the same allocation is fine once the cap is gone


def test_memory_cap_allows_what_fits():
    with budget.memory_cap(0.5, CPU):
        assert torch.ones(2**20).sum() == 2**20  # 4 MiB


def test_memory_cap_none_changes_nothing():
    before = resource.getrlimit(resource.RLIMIT_AS)
    with budget.memory_cap(None, CPU):
        assert resource.getrlimit(resource.RLIMIT_AS) == before
        assert torch.empty(HUGE).numel() == HUGE


def test_memory_cap_is_lifted_when_the_block_raises():
    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(KeyError), budget.memory_cap(0.1, CPU):
        assert resource.getrlimit(resource.RLIMIT_AS) != before
        raise KeyError("not memory")
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_time_limit_raises_job_timeout_and_disarms():
    previous = signal.getsignal(signal.SIGALRM)
    started = time.perf_counter()
    with pytest.raises(budget.JobTimeout, match="max_seconds=0.1"), budget.time_limit(0.1):
        time.sleep(5)
    assert time.perf_counter() - started < 2
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is previous


def test_time_limit_is_disarmed_after_a_block_that_finishes_in_time():
    with budget.time_limit(0.2):
        pass
    time.sleep(0.3)  # an alarm left armed would fire here
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("limit", [None, 0])
def test_no_time_limit(limit):
    with budget.time_limit(limit):
        time.sleep(0.05)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limit_is_a_no_op_outside_the_main_thread():
    errors = []

    def job():
        try:
            with budget.time_limit(0.05):
                time.sleep(0.2)
        except BaseException as error:  # noqa: BLE001 — reported below
            errors.append(error)

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert errors == []


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        budget.MemoryBudgetExceeded("needs 40 GiB"),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 bytes"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] not enough memory: you tried to allocate"
        ),
    ],
    ids=repr,
)
def test_allocation_failures_are_out_of_memory(error):
    assert budget.is_out_of_memory(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("out of memory"),  # a message alone does not make a bad option an OOM
        RuntimeError("shape mismatch"),
        budget.JobTimeout("measurement exceeded budget.max_seconds=1"),
    ],
    ids=repr,
)
def test_other_errors_are_not_out_of_memory(error):
    assert not budget.is_out_of_memory(error)


def test_a_broad_except_in_the_job_does_not_swallow_the_timeout():
    def log_quietly():  # the shape of tracking._WandbTracker._guard
        try:
            time.sleep(0.2)
        except Exception:
            pass

    with pytest.raises(budget.JobTimeout), budget.time_limit(0.05):
        log_quietly()
        time.sleep(0.3)


def test_timeouts_leave_the_process_fit_for_the_next_job():
    script = textwrap.dedent("""
        import torch
        from experiments.app.job import import_for_measuring
        from experiments.measurement.budget import JobTimeout, time_limit

        import_for_measuring()  # what the runner imports before a job's budget starts

        def new_optimizer():
            return torch.optim.AdamW([torch.zeros(1, requires_grad=True)])

        for job in range(40):  # jobs of a serial sweep, each out of time early in training
            try:
                with time_limit(0.05):
                    new_optimizer()
                break
            except JobTimeout:
                pass
        new_optimizer()  # the next job's training
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-1500:]
