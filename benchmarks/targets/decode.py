"""Decoding: exact attention's per-token read of its cache at 64K as a fraction of the copy
bandwidth (>= 0.5), linear, Performer and DeltaNet's ms/token flat from 1K to 64K (within 1.5x:
a fixed state), and the window caches (blockwise, longformer) no larger at 64K than at 4K.

`--skip-decode` leaves these rows out; `experiments.measurement.decode_cost.measure_decode` is the
same measurement as `measure.decode`.
"""

from __future__ import annotations

import statistics

from benchmarks.targets.kernels import kernel, shape
from benchmarks.targets.table import Target, at_least, at_most
from experiments.measurement.decode_cost import measure_decode

DECODE_LENGTH = 65536
DECODE_SHORT = 1024  # the flat-time targets compare against this context
DECODE_WINDOWED = 4096  # past every window cache's window: its cache must not grow beyond
DECODE_STEPS = 64


def decode_columns(name: str, length: int) -> dict:
    """`measure_decode` of the targets' kernel `name` at `shape()` and context `length`."""
    at = shape()
    attend = kernel(name, length + DECODE_STEPS + 2)
    dims = (at.batch, at.heads, length, at.head_dim)
    return measure_decode(attend, dims, at.device, at.dtype, steps=DECODE_STEPS, warmup=2)


def decode_targets(length: int, rounds: int) -> list[Target]:
    """Exact decode's bandwidth fraction at `length`; the fixed-state decodes' (linear,
    Performer, DeltaNet) ms/token at `length` over DECODE_SHORT (median over `rounds`, each
    measured at both contexts in turn); the window caches' bytes at `length` over
    DECODE_WINDOWED."""
    full = [decode_columns("full", length)["decode_bandwidth_fraction"] for _ in range(rounds)]
    rows = [at_least(f"full decode bandwidth fraction, L={length}", statistics.median(full), 0.5)]
    print(f"full decode bandwidth fraction at {length}: {', '.join(f'{f:.2f}' for f in full)}")
    for name in ("linear", "performer", "deltanet"):
        ratios = []
        for _ in range(rounds):
            short = decode_columns(name, DECODE_SHORT)["decode_ms_per_token"]
            ratios.append(decode_columns(name, length)["decode_ms_per_token"] / short)
        label = f"{name} decode ms/token L={length} / L={DECODE_SHORT}"
        rows.append(at_most(label, statistics.median(ratios), 1.5))
        print(f"{label}: {', '.join(f'{r:.2f}' for r in ratios)}")
    for name in ("blockwise", "longformer"):
        ratio = (
            decode_columns(name, length)["decode_state_bytes"]
            / decode_columns(name, DECODE_WINDOWED)["decode_state_bytes"]
        )
        rows.append(at_most(f"{name} cache bytes L={length} / L={DECODE_WINDOWED}", ratio, 1.0))
    return rows
