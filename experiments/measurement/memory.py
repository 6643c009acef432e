"""Peak memory of a piece of work, with the same meaning on CPU and CUDA.

`peak_memory_bytes` is the peak of bytes held by tensors allocated while `fn` runs, above what
was live before it started. On CUDA it is the caching allocator's peak after a reset; on CPU the
allocator keeps no such counter, so we replay the profiler's allocation and free events in time
order and take the running maximum, which is the same quantity when `fn` frees nothing that was
live before it started (the suite's measured calls release their gradients at their end, not at
their start: `experiments/measurement/measure.py`). The replay counts a free only of a block it
saw allocated, with the size it saw, and keeps the profiler's own chatter off the console.

Why only frees of blocks it saw allocated (a measured case): docs/internals.md, "memory".
"""

from __future__ import annotations

import os
import re
import resource
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch._C._profiler import _EventType
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
    return replayed_peak(_allocation_events(prof.profiler.kineto_results.experimental_event_tree()))


def replayed_peak(events: Iterable[tuple[int, int, int]]) -> int:
    """The running maximum of live bytes over (time_ns, address, bytes) events, bytes positive
    for an allocation and negative for a free, in any order (replayed in time order). A free
    counts only if its address was allocated in `events` and counts that allocation's size:
    blocks live before the events began are not known, so their frees are not subtracted."""
    live_blocks: dict[int, int] = {}
    live = peak = 0
    for _, address, nbytes in sorted(events, key=lambda event: event[0]):  # stable on ties
        if nbytes > 0:
            live += nbytes - live_blocks.get(address, 0)  # a missed free at a reused address
            live_blocks[address] = nbytes
            peak = max(peak, live)
        else:
            live -= live_blocks.pop(address, 0)
    return int(peak)


def _allocation_events(roots) -> list[tuple[int, int, int]]:
    """(time_ns, address, bytes) of every allocation and free under the profiler's event tree,
    in the tree's order."""
    events, stack = [], list(reversed(roots))
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(reversed(event.children))
    return events


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
