"""Block types by name: how attention and feed-forward sublayers are wired, stored and recomputed.

    residual    pre-norm x + Attn(LN x), x + FF(LN x); autograd keeps every activation
    reversible  RevNet coupling; backward reconstructs inputs, memory independent of depth
    checkpoint  the residual block under activation checkpointing; keeps each block's input

A block is built alone with `build_block`; a list of blocks of one type runs as a single
(batch, seq_len, d_model) -> (batch, seq_len, d_model) module built by `build_stack`, since the
reversible type runs its whole stack as one autograd Function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from variants.blocks.checkpoint import CheckpointBlock
from variants.blocks.residual import ResidualBlock, sequential_stack
from variants.blocks.reversible import ReversibleBlock, ReversibleStack

# name -> (block class, how a list of such blocks runs)
_BLOCKS: dict[str, tuple[type[nn.Module], Callable[[list], nn.Module]]] = {
    "residual": (ResidualBlock, sequential_stack),
    "reversible": (ReversibleBlock, ReversibleStack),
    "checkpoint": (CheckpointBlock, sequential_stack),
}


def block_names() -> list[str]:
    """Names of the block types."""
    return list(_BLOCKS)


def build_block(
    name: str,
    d_model: int,
    n_heads: int,
    attention: str = "full",
    attention_options: dict[str, Any] | None = None,
    ff_mult: int = 4,
    dropout: float = 0.0,
    ff_chunks: int = 1,
    causal: bool = True,
    shared_qk: bool = False,
    max_seq_len: int = 4096,
) -> nn.Module:
    """One block of type `name` with an attention kernel built by name through the registry.

    Residual and checkpoint blocks map x (batch, seq_len, d_model) to the same shape; a
    reversible block maps the pair (x1, x2) to (y1, y2). Bad options raise `ValueError` naming
    the block part and the option.
    """
    block_cls, _ = _lookup(name)
    return block_cls(
        d_model,
        n_heads,
        attention=attention,
        attention_options=attention_options,
        ff_mult=ff_mult,
        dropout=dropout,
        ff_chunks=ff_chunks,
        causal=causal,
        shared_qk=shared_qk,
        max_seq_len=max_seq_len,
    )


def build_stack(name: str, blocks: list[nn.Module]) -> nn.Module:
    """Run `blocks` (all of type `name`, at least one) as (B, L, d_model) -> (B, L, d_model)."""
    block_cls, stack = _lookup(name)
    if not blocks:
        raise ValueError(f"block {name!r}: a stack needs at least one block, got none")
    for block in blocks:
        if type(block) is not block_cls:
            raise ValueError(
                f"block {name!r}: a stack holds only {block_cls.__name__}s, "
                f"got {type(block).__name__}"
            )
    return stack(blocks)


def _lookup(name: str):
    if name not in _BLOCKS:
        raise ValueError(f"unknown block {name!r}; available: {', '.join(_BLOCKS)}")
    return _BLOCKS[name]


__all__ = [
    "CheckpointBlock",
    "ResidualBlock",
    "ReversibleBlock",
    "ReversibleStack",
    "block_names",
    "build_block",
    "build_stack",
]
