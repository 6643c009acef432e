"""Peak memory of a piece of work, with the same meaning on CPU and CUDA.

`peak_memory_bytes` is the peak of bytes held by tensors allocated while `fn` runs, above what was
live before it started. On CUDA it is the caching allocator's peak after a reset; on CPU the
allocator keeps no such counter, so we replay the profiler's allocation and free events in time
order and take the running maximum, which is the same quantity. The profiler's own chatter on
stderr (its start and stop lines, and that blocks allocated before it started have no known
size, which is expected: only what `fn` allocates counts) is kept off the console.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.profiler import ProfilerActivity, profile

# What the CPU profiler writes to the process's stderr (fd 2, from C++) on every use.
PROFILER_CHATTER = re.compile(
    r"USDT:.*profiler_(start|stop)|Memory block of unknown size was allocated before the profiling"
)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes of live tensors allocated by `fn()` on `device` (bytes, > 0 if fn allocates)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - baseline)
    with (
        _without_profiler_chatter(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()  # positive for an allocation, negative for a free
        peak = max(peak, live)
    return int(peak)


@contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """Send fd 2 to a file inside the block, then pass on every line that is not chatter."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line
                for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                if not PROFILER_CHATTER.search(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB
