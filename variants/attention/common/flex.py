"""The `impl=flex` path: PyTorch's FlexAttention over a block mask built from a pattern.

`blockwise`, `strided` and `combined` take `impl="flex"`: instead of their own kernels they run
`torch.nn.attention.flex_attention.flex_attention` with a `BlockMask` made from the same
`variants.patterns` predicate, so the two paths compute one pattern by construction. The block
mask comes from the pattern's block form (`tile_states`, O((L / tile)^2)) with the predicate as
its `mask_mod` inside the partial tiles, on the inputs' device: `create_block_mask` would
evaluate the predicate on all L^2 pairs (and in some releases defaulted to device "cuda").

On CUDA FlexAttention trains. On CPU PyTorch 2.13 runs its forward only ("FlexAttention does
not support backward on CPU"), so a call that would need a backward raises a `ValueError`
naming the option, and the runner refuses training jobs up front (`supports_backward`).
`COMPILE` selects `torch.compile(flex_attention)` (the fused kernel; the first call at each
shape compiles, ~30 s on 2 CPU cores) or the eager reference, which materialises the scores.
"""

from __future__ import annotations

import torch

from variants import patterns
from variants.checks import require_choice

IMPLS = ("native", "flex")
COMPILE = True  # False: eager flex_attention (tests: same function, no compile time)
RECOMPILE_LIMIT = 64  # compiles of flex_attention per process (patterns x lengths x dtypes)
_compiled = None


def require_impl(owner: str, impl: str) -> str:
    """`impl` if it is native or flex, else a `ValueError` naming `owner` and the option."""
    return require_choice(owner, "impl", impl, IMPLS)


def supports_backward(impl: str, device: torch.device) -> bool:
    """Whether `impl` can train on `device`: FlexAttention has no CPU backward."""
    return not (impl == "flex" and torch.device(device).type == "cpu")


def mask_reason(impl: str, option: str) -> str | None:
    """Why `impl` cannot take input `option` (attention_mask, segment_ids), or None: the
    compiled FlexAttention path is built per pattern, not per sequence."""
    if impl == "flex" and option in ("attention_mask", "segment_ids"):
        return "impl='flex' takes no per-sequence masks yet; use impl='native'"
    return None


def block_mask(pattern: patterns.Pattern, seq_len: int, tile: int, device: torch.device):
    """FlexAttention's `BlockMask` of `pattern` at `seq_len` with square tiles of `tile`: the
    pattern's FULL tiles as full blocks, its PARTIAL ones with the predicate as `mask_mod`."""
    from torch.nn.attention.flex_attention import BlockMask

    states = pattern.tile_states(seq_len, tile).to(device)  # (n, n)

    def listed(kind):  # per query tile: how many key tiles of `kind`, their indices first
        chosen = states == kind
        order = torch.sort((~chosen).to(torch.uint8), dim=1, stable=True).indices
        return chosen.sum(1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    partial_count, partial_index = listed(patterns.PARTIAL)
    full_count, full_index = listed(patterns.FULL)
    return BlockMask.from_kv_blocks(
        partial_count,
        partial_index,
        full_count,
        full_index,
        BLOCK_SIZE=tile,
        mask_mod=pattern.mask_mod(),
        seq_lengths=(seq_len, seq_len),
    )


def attend(owner: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """flex_attention(q, k, v) under `mask` (a `block_mask`): (B, H, L, D) -> (B, H, L, D).

    Raises `ValueError` naming `owner`'s option `impl` when the call would need a backward on
    CPU (grad enabled and an input that requires it). A row with no allowed key gives zeros.
    """
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if needs_grad and not supports_backward("flex", q.device):
        raise ValueError(
            f"{owner}: option impl='flex' runs forward only on CPU (PyTorch "
            f"{torch.__version__}'s FlexAttention has no CPU backward); train with "
            "impl='native', or call it under torch.no_grad()"
        )
    if not needs_grad:  # FlexAttention refuses CPU inputs that require grad even then
        q, k, v = q.detach(), k.detach(), v.detach()
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled
    function = flex_attention
    if COMPILE:
        if _compiled is None:
            # Every pattern and length is a compile of its own (the mask_mod's structure is
            # guarded on); past dynamo's default of 8 per function it would silently fall
            # back to the unfused eager path, which holds all L^2 scores.
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
            _compiled = torch.compile(flex_attention, dynamic=False)
        function = _compiled
    return function(q, k, v, block_mask=mask)
