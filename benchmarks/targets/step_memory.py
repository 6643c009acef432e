"""Memory at 64K: the peak live-tensor bytes of one training step (forward and backward of the
next-token loss) of a one-layer model, under 4 GB for each of MEMORY_KERNELS (compressed
attention measured alongside, without a bound)."""

from __future__ import annotations

import time

from benchmarks.targets.kernels import model, shape, training_step
from benchmarks.targets.table import Target, info
from experiments.measurement.memory import peak_memory_bytes

MEMORY_LENGTH = 65536
MEMORY_KERNELS = (
    "lsh",
    "blockwise",
    "strided",
    "linformer",
    "routing",
    "performer",
    "linear",
    "longformer",
    "bigbird",
    "moba",
    "nsa",
    "deltanet",
    "gated_deltanet",
    "mamba2",
    "sliding_window",
)
MEMORY_INFO_KERNELS = ("compressed",)  # measured alongside, without a bound
MEMORY_LIMIT_BYTES = 4 * 10**9  # the target says 4 GB: 3.73 GiB
GiB = 2**30


def memory_targets(length: int, variants: list[str] | None = None) -> list[Target]:
    """Peak live-tensor bytes of one training step of a one-layer model at `length`, for the
    memory kernels among `variants` (default all)."""
    rows = []
    for name in MEMORY_KERNELS + MEMORY_INFO_KERNELS:
        if variants is not None and name not in variants:
            continue
        step = training_step(model(name, length), length)
        start = time.perf_counter()
        peak = peak_memory_bytes(step, shape().device)
        elapsed = time.perf_counter() - start
        row = f"{name} 1-layer fwd+bwd peak GiB, L={length} ({elapsed:.0f} s)"
        if name in MEMORY_KERNELS:
            bound = f"< {MEMORY_LIMIT_BYTES / GiB:.2f} (4 GB)"
            rows.append(Target(row, peak / GiB, bound, peak < MEMORY_LIMIT_BYTES))
        else:
            rows.append(info(row, peak / GiB))
        print(f"{row}: {peak / GiB:.2f}")
    return rows
