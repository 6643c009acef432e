"""PyTorch's CPU allocator on transparent huge pages, on by default in the suite's processes.

With `THP_MEM_ALLOC_ENABLE=1`, c10 allocates blocks of 2 MiB and more 2 MiB-aligned and advises
the kernel to back them with huge pages (`madvise`), so large tensors fault in a few huge pages
instead of thousands of small ones. Measured here: blockwise's FLOP fraction at 32K 0.26 without
it, 0.32 with it. c10 reads the variable once, at torch's first allocation, so it must be in the
environment before torch starts: the entry points set it before they import torch (the app,
`experiments/run.py`, at the top of its imports; the `benchmarks` package when it is imported);
`import experiments` changes no environment variable. Child processes (joblib and submitit
workers) inherit it.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def enable_by_default() -> None:
    """Set THP_MEM_ALLOC_ENABLE=1 unless the environment already sets it (a user's own value,
    `0` included, wins) or torch is already imported (then the allocator may have read the
    variable already, and setting it now would only make the record say what did not happen)."""
    if "torch" not in sys.modules:
        os.environ.setdefault(VARIABLE, "1")


def thp_mem_alloc() -> bool:
    """Whether this process runs with the huge-page allocation: the variable is `1` (c10 takes
    `0` and `1`, and warns about and ignores anything else)."""
    return os.environ.get(VARIABLE) == "1"
