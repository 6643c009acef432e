"""The Reformer's rows (`--reformer`): one training step of a 12-layer LSH model at 64K tokens
with reversible and then residual blocks, each in its own process (`steps`)."""

from __future__ import annotations

from benchmarks.targets.kernels import HEAD_DIM, HEADS
from benchmarks.targets.steps import OnRow, StepRow, describe, run_step_row

REFORMER_LENGTH = 65536
REFORMER_DEPTH = 12


def reformer_rows(
    length: int = REFORMER_LENGTH, d_model: int = HEADS * HEAD_DIM, on_row: OnRow = None
) -> list[StepRow]:
    """One training step of REFORMER_DEPTH LSH layers at `length`, reversible then residual;
    each printed and given to `on_row` as it ends."""
    rows = []
    for block in ("reversible", "residual"):
        label = f"lsh, {REFORMER_DEPTH} {block} layers, d_model {d_model}, L={length}"
        row = run_step_row(label, "lsh", length, REFORMER_DEPTH, block, d_model)
        print(f"{row.name}: {describe(row)}", flush=True)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
