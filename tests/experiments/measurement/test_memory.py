"""Peak memory on CPU: the profiler's chatter stays off the console, its numbers stay right and
repeat whatever ran before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from experiments.measurement import allocator
from experiments.measurement.memory import peak_memory_bytes, replayed_peak

ROOT = Path(__file__).resolve().parents[3]


def test_profiler_chatter_is_kept_off_the_console_and_other_output_is_not(capfd):
    x = torch.randn(64, 64)
    before = [torch.randn(256)]  # allocated before profiling: freed inside it ("unknown size")

    def step():
        before.clear()
        print("a line of the measured code", file=sys.stderr)
        (x @ x).sum()

    peak = peak_memory_bytes(step)
    err = capfd.readouterr().err
    assert "USDT" not in err and "Memory block of unknown size" not in err, err
    assert err.splitlines() == ["a line of the measured code"]
    assert peak >= 64 * 64 * 4  # the product's bytes


# In a fresh process on the huge-page allocation, as a job runs (experiments/measurement/
# allocator.py): a block of 4 MiB and then another of that size land at one address.
STALE_SIZE = """
import torch
from experiments.measurement.memory import peak_memory_bytes

n = 1 << 22
kept = []
peak_memory_bytes(lambda: kept.append(torch.ones(n // 4)))  # its size enters c10's table
address = kept[0].data_ptr()
kept.clear()  # freed while no profiler runs: the entry stays
kept.append(torch.ones(n // 4))  # allocated while no profiler runs, at the dead block's address
assert kept[0].data_ptr() == address, "the allocator did not reuse the address"


def fn():
    kept.clear()  # its free must not count: this call never saw it allocated
    return torch.ones(n // 4 // 2)


print(peak_memory_bytes(fn), n // 2)
"""


def test_a_block_freed_between_profilings_does_not_lower_a_later_peak():
    """c10 keeps a block's size from one profiling to the next when the block is freed in
    between; a later block at its address, freed in a later profiling, was subtracted at the
    dead block's size, so a job's peak depended on the jobs its worker had run."""
    env = {**os.environ, allocator.VARIABLE: "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", STALE_SIZE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak, allocated = done.stdout.split()
    assert peak == allocated


def test_a_call_that_replaces_an_earlier_tensor_has_the_same_peak_every_time():
    """The first call replaces a tensor allocated before any profiling, later calls one the
    previous profiling saw: the peak counts what the call allocates either way."""
    n = 1 << 20
    held = [torch.ones(n // 4)]

    def fn():
        held[0] = None  # freed first, as a gradient set to None
        held[0] = torch.ones(n // 4)

    assert [peak_memory_bytes(fn) for _ in range(3)] == [n, n, n]


def test_the_replay_counts_frees_of_blocks_it_saw_at_the_size_it_saw():
    events = [
        (3, 0xA, -100),  # a block from before: not subtracted
        (1, 0xB, 40),
        (2, 0xC, 60),  # peak 100 at t=2
        (4, 0xB, -999),  # a size that disagrees with the allocation's: 40 is subtracted
        (5, 0xD, 30),  # 90
        (6, 0xC, 60),  # 0xC again without a free seen: counted once
    ]
    assert replayed_peak(events) == 100
    assert replayed_peak([*events, (7, 0xE, 20)]) == 110  # 30 + 60 + 20
    assert replayed_peak([]) == 0
