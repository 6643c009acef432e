"""Budgets that turn runaway configurations into records instead of a dead machine.

`memory_cap` lowers the process's address-space limit (CPU) or the CUDA allocator's fraction so a
too-large allocation raises inside the job, where it is recorded as `oom`. `time_limit` raises
`JobTimeout` after a wall-clock limit, recorded as `timeout`. Both restore the previous state.
"""

from __future__ import annotations

import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the app imports this before any job
    import torch


class JobTimeout(BaseException):
    """The measurement ran past `budget.max_seconds`.

    A BaseException, like KeyboardInterrupt, so that an `except Exception` on the way (a logging
    guard, say) cannot swallow it and let the job run on past its budget.
    """


class MemoryBudgetExceeded(Exception):
    """A predicted or actual allocation is over `budget.max_memory_gb`."""


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    return pages * resource.getpagesize()


@contextmanager
def memory_cap(max_memory_gb: float | None, device: torch.device) -> Iterator[None]:
    """Allow at most `max_memory_gb` GiB of new memory inside the block (None = no cap).

    CPU: soft RLIMIT_AS = current address space + the budget, so a failed malloc surfaces as a
    RuntimeError from torch instead of the kernel's OOM killer. The soft limit is restored after,
    so the next job of a serial sweep starts uncapped. CUDA: the allocator's per-process fraction.
    """
    if max_memory_gb is None:
        yield
        return
    budget = int(max_memory_gb * 2**30)
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        previous_fraction = 1.0
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(previous_fraction, device)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + budget
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextmanager
def time_limit(max_seconds: float | None) -> Iterator[None]:
    """Raise `JobTimeout` in the main thread after `max_seconds` (None = no limit).

    Uses SIGALRM, so it only arms in the main thread (where Hydra runs jobs); elsewhere it is a
    no-op rather than an error.
    """
    if not max_seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _expire(signum, frame):
        raise JobTimeout(f"measurement exceeded budget.max_seconds={max_seconds}")

    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, float(max_seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def is_out_of_memory(error: BaseException) -> bool:
    """True for the exceptions an allocation failure raises on CPU or CUDA."""
    import torch

    if isinstance(error, (MemoryError, MemoryBudgetExceeded, torch.OutOfMemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "can't allocate memory" in text
        or "not enough memory" in text
        or "out of memory" in text.lower()
    )
