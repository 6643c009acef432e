"""A million tokens (`--million`): one training step of a one-layer model at 2^20 tokens per
O(L) variant, each in its own process (`steps`), its peak RSS bound 16 GB."""

from __future__ import annotations

from benchmarks.targets.kernels import HEAD_DIM, HEADS
from benchmarks.targets.steps import StepRow, describe, run_step_row

MILLION_LENGTH = 2**20
MILLION_KERNELS = (
    "blockwise",
    "lsh",
    "linear",
    "performer",
    "longformer",
    "bigbird",
    "routing",
    "moba",
    "nsa",
    "deltanet",
)
# Rows printed without a run, and why.
MILLION_NOT_RUN = {
    "sparse_fixed": "quadratic at 2^20: its summary columns give each query ~L/8 keys "
    "(~5e14 FLOP per step); not run",
}
MILLION_LIMIT_BYTES = 16 * 10**9  # the target says 16 GB at 2^20 tokens
BEYOND_MILLION_LIMIT_BYTES = 20 * 10**9  # and 20 GB at 2^21 (blockwise, linear)


def million_bound(length: int) -> int:
    """The peak-RSS bound of a one-layer step at `length` tokens: 16 GB up to 2^20, 20 GB
    beyond."""
    return MILLION_LIMIT_BYTES if length <= MILLION_LENGTH else BEYOND_MILLION_LIMIT_BYTES


def million_rows(length: int = MILLION_LENGTH, names: str | None = None) -> list[StepRow]:
    """One layer, one training step at `length` tokens per O(L) variant (all, or `names`,
    comma-separated), with MILLION_SWITCHES; each printed as it ends."""
    chosen = names.split(",") if names else [*MILLION_KERNELS, *MILLION_NOT_RUN]
    rows = []
    for name in chosen:
        label = f"{name}, 1 layer, L={length}"
        if name in MILLION_NOT_RUN:
            row = StepRow(label, note=MILLION_NOT_RUN[name])
        else:
            row = run_step_row(label, name, length, 1, "residual", HEADS * HEAD_DIM)
            row.bound_bytes = million_bound(length)
        print(f"{row.name}: {describe(row)}", flush=True)
        rows.append(row)
    return rows
