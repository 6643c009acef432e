"""How many CPU cores are free, measured once when a timing sweep starts.

A timing sweep runs one job per free core, each on one thread (`conf/experiment/scaling.yaml`:
`threads: 1`, `hydra.launcher.n_jobs: ${timing_workers:${device}}`). Why one thread: with two
torch threads and one core taken by another process, every parallel region waits for the
thread that shares a core, and the kernels that spend their time in many small calls (sparse
patterns, kernel methods) lose far more than SDPA's few large fused calls; interleaved rounds
cancel drift, not that. At one thread a job's speed-ups over SDPA measured beside a busy core
agree with a quiet machine's (docs/report.md "Crossovers, busy and quiet"). Why one job per
free core: a quiet machine is still used whole, and a busy one is not oversubscribed.

The figure is taken once, by the process that launches the sweep, and handed to its workers
through `ATTNBENCH_TIMING_WORKERS` (they start after it is set), so every job of a sweep
records the same `parallel_jobs` whatever the load when it started.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV = "ATTNBENCH_TIMING_WORKERS"
SAMPLE_SECONDS = 0.5


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs since boot from Linux's /proc/stat; None elsewhere.

    Idle counts `idle` and `iowait` (a core waiting on the disk is free to compute); total
    leaves out `guest` and `guest_nice`, which `user` and `nice` already include.
    """
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


def free_cores(
    sample_seconds: float = SAMPLE_SECONDS,
    read: Callable[[], tuple[int, int] | None] = cpu_times,
    cores: int | None = None,
) -> int:
    """Whole cores left idle over `sample_seconds` (rounded to the nearest, 1 to `cores`).

    `cores` defaults to `usable_cores()`. Where the idle time cannot be read (not Linux), every
    usable core counts as free.
    """
    cores = usable_cores() if cores is None else cores
    before = read()
    time.sleep(sample_seconds)
    after = read()
    if before is None or after is None or after[1] <= before[1]:
        return cores
    idle_fraction = (after[0] - before[0]) / (after[1] - before[1])
    # /proc/stat sums every online core; scale by the usable ones (a container may get fewer).
    return min(cores, max(1, round(idle_fraction * (os.cpu_count() or cores))))


def timing_workers(device: str) -> int:
    """Jobs a timing sweep runs side by side: one per free CPU core, measured once per launch.

    On CUDA (or `auto` with a GPU present) one job at a time: parallel jobs would share the GPU.
    """
    if device == "cuda" or (device == "auto" and _cuda_available()):
        return 1
    if os.environ.get(ENV, "").isdigit() and int(os.environ[ENV]) > 0:
        return int(os.environ[ENV])
    workers = free_cores()
    os.environ[ENV] = str(workers)  # the launcher's workers inherit it: one figure per sweep
    return workers


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
