"""Block types by name: how attention and feed-forward sublayers are wired, stored and recomputed.

    residual    pre-norm x + Attn(LN x), x + FF(LN x); autograd keeps every activation
    reversible  RevNet coupling; backward reconstructs inputs, memory independent of depth
    checkpoint  the residual block under activation checkpointing; keeps each block's input

A block wires two sublayers it is given (`wire`: the model builds them from its config, so a
block never reads the config); `build_block` builds one alone. A list of blocks of one type runs
as a single
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
from variants.layers import pre_norm_sublayers
from variants.model_config import ModelConfig
from variants.registry_base import Registry

# name -> (block class, how a list of such blocks runs)
_BLOCKS: Registry[tuple[type[nn.Module], Callable[[list], nn.Module]]] = Registry("block")
_BLOCKS.add(ResidualBlock.name, (ResidualBlock, sequential_stack))
_BLOCKS.add(ReversibleBlock.name, (ReversibleBlock, ReversibleStack))
_BLOCKS.add(CheckpointBlock.name, (CheckpointBlock, sequential_stack))


def register_block(cls: type[nn.Module], stack: Callable[[list], nn.Module] = sequential_stack):
    """Add block type `cls` (built as `cls(attn, ff)`, (B, L, d_model) -> same) under
    `cls.name`; `stack` runs a list of them (default: one after the other). Usable as a
    class decorator."""
    _BLOCKS.add(cls.name, (cls, stack))
    return cls


def block_names() -> list[str]:
    """Names of the block types."""
    return _BLOCKS.names()


def build_block(
    name: str, config: ModelConfig | int | None = None, n_heads: int | None = None, **fields: Any
) -> nn.Module:
    """One block of type `name` whose layers `config` describes (its `block` field is not read).

    `build_block(name, config)`, or with the `ModelConfig` fields themselves, as before:
    `build_block(name, d_model, n_heads, attention="lsh", ...)`. Residual and checkpoint blocks
    map x (batch, seq_len, d_model) to the same shape; a reversible block maps the pair
    (x1, x2) to (y1, y2). Bad options raise `ValueError` naming the option.
    """
    _BLOCKS[name]  # unknown -> lists the block types
    if not isinstance(config, ModelConfig):
        sizes = {"d_model": config, "n_heads": n_heads}
        config = ModelConfig(**{k: v for k, v in sizes.items() if v is not None}, **fields)
    elif n_heads is not None or fields:
        raise TypeError("build_block: pass a ModelConfig or its fields, not both")
    return wire(name, *pre_norm_sublayers(config, config.kernel()))


def wire(name: str, attn: nn.Module, ff: nn.Module) -> nn.Module:
    """A block of type `name` around its pre-normed attention and feed-forward sublayers
    (`variants.layers.pre_norm_sublayers`)."""
    block_cls, _ = _BLOCKS[name]
    return block_cls(attn, ff)


def build_stack(name: str, blocks: list[nn.Module]) -> nn.Module:
    """Run `blocks` (all of type `name`, at least one) as (B, L, d_model) -> (B, L, d_model)."""
    block_cls, stack = _BLOCKS[name]
    if not blocks:
        raise ValueError(f"block {name!r}: a stack needs at least one block, got none")
    for block in blocks:
        if type(block) is not block_cls:
            raise ValueError(
                f"block {name!r}: a stack holds only {block_cls.__name__}s, "
                f"got {type(block).__name__}"
            )
    return stack(blocks)


__all__ = [
    "CheckpointBlock",
    "ResidualBlock",
    "ReversibleBlock",
    "ReversibleStack",
    "block_names",
    "register_block",
    "build_block",
    "build_stack",
    "wire",
]
