"""A million tokens (`--million`): one training step of a one-layer model at 2^20 tokens per
O(L) variant, each in its own process (`steps`), its peak RSS bound 16 GB."""

from __future__ import annotations

from benchmarks.targets.kernels import HEAD_DIM, HEADS
from benchmarks.targets.steps import OnRow, StepRow, describe, run_step_row
from variants.registry import MILLION_FLOPS, MILLION_TOKENS, attention_spec, million_flops, select

MILLION_LENGTH = MILLION_TOKENS


def million_kernels() -> list[str]:
    """The variants whose forward at 2^20 tokens their own FLOP model puts within
    `registry.MILLION_FLOPS` (`select("published", "million")`), in registry order."""
    return select("published", "million")


def not_run() -> dict[str, str]:
    """The other causal variants, each with why it is not run: its FLOPs at 2^20."""
    chosen = million_kernels()
    return {
        name: f"about {million_flops(attention_spec(name)):.1e} FLOP per forward at 2^20 "
        f"tokens (over {MILLION_FLOPS:.0e}): not run"
        for name in select("causal", "published")
        if name not in chosen
    }


MILLION_LIMIT_BYTES = 16 * 10**9  # the target says 16 GB at 2^20 tokens
BEYOND_MILLION_LIMIT_BYTES = 20 * 10**9  # and 20 GB at 2^21 (blockwise, linear)


def million_bound(length: int) -> int:
    """The peak-RSS bound of a one-layer step at `length` tokens: 16 GB up to 2^20, 20 GB
    beyond."""
    return MILLION_LIMIT_BYTES if length <= MILLION_LENGTH else BEYOND_MILLION_LIMIT_BYTES


def million_rows(
    length: int = MILLION_LENGTH, names: str | None = None, on_row: OnRow = None
) -> list[StepRow]:
    """One layer, one training step at `length` tokens per O(L) variant (all, or `names`,
    comma-separated), with MILLION_SWITCHES; each printed and given to `on_row` as it ends."""
    skipped = not_run()
    chosen = names.split(",") if names else [*million_kernels(), *skipped]
    rows = []
    for name in chosen:
        label = f"{name}, 1 layer, L={length}"
        if name in skipped:
            row = StepRow(label, note=skipped[name])
        else:
            row = run_step_row(label, name, length, 1, "residual", HEADS * HEAD_DIM)
            row.bound_bytes = million_bound(length)
        print(f"{row.name}: {describe(row)}", flush=True)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
