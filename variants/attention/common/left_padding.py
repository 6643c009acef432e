"""Prefill of a left-padded prompt (a batch of prompts of different lengths, each row's pads
first): `Attention.prefill(..., attention_mask=)` runs one of the two hooks here, by its cache.

  prefill_rows    a state cache (`Cache.holds_positions` False: running sums, a d x d matrix):
                  each row's real positions prefilled alone into a cache of one row, put in
                  (`put_row`); no pad ever enters the state, and the row is the row alone
  prefill_masked  a cache of positions: the masked forward over the prompt, every slot cached,
                  which the kernel's decode steps leave out (`Attention.decode_masks_padding`)

Either way the cache remembers each row's pads (`Cache.pads`: a row's own positions, rotary
ones, are the cache's less its pads), and its `length` counts them: the positions after the
prompt are one count for every row, whose shift a shift-invariant pattern does not see.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.common.masking import (
    left_pads,
    zero_padded_positions,
    zero_padded_queries,
)
from variants.checks import UnsupportedCombination, check_attention_mask, token_mask


def prompt_pads(kernel, q: torch.Tensor, cache, attention_mask) -> torch.Tensor | None:
    """The prompt's pads per row (B,) int64 from its left-padded `attention_mask` (B, T), None
    without a mask or any pad; raises for a mask `kernel` or `cache` cannot take
    (`Attention.padded_prefill_reason`)."""
    if attention_mask is None:
        return None
    attention_mask = token_mask(kernel.name, attention_mask, None)
    check_attention_mask(kernel.name, attention_mask, q)
    pads = left_pads(kernel.name, attention_mask)
    reason = None if pads is None else kernel.padded_prefill_reason(cache)
    if reason is not None:
        raise UnsupportedCombination(
            f"attention {kernel.name!r} does not prefill a left-padded option 'attention_mask': "
            f"{reason}"
        )
    return pads


def prefill_rows(kernel, q, k, v, cache, *gates, pads: torch.Tensor) -> torch.Tensor:
    """q, k, v (B, H, T, D) (and gates) -> (B, H, T, D): each row's real positions through
    `kernel.prefill_into` on a fresh cache of one row, padded queries' outputs zeros. The
    cache changes only once every row has run."""
    rows, outs = [], []
    for b, pad in enumerate(pads.tolist()):
        row = kernel.new_cache(
            1, cache.heads, cache.head_dim, max_len=cache.max_len, device=cache.device,
            dtype=cache.dtype,
        )  # fmt: skip
        row.query_heads = cache.query_heads
        real = [x[b : b + 1, :, pad:] for x in (q, k, v, *gates)]  # (1, H, T - pad, ...)
        out = kernel.prefill_into(*real[:3], row, *real[3:])  # (1, H, T - pad, D)
        outs.append(F.pad(out, (0, 0, pad, 0)))  # (1, H, T, D)
        rows.append(row)
    for b, row in enumerate(rows):
        cache.put_row(b, row)
    cache.reserve(q.shape[2])
    cache.pads = pads  # for the positions after the prompt (rotary: `CachedKernel.offset`)
    return torch.cat(outs)  # (B, H, T, D)


def prefill_masked(kernel, q, k, v, cache, *gates, pads: torch.Tensor) -> torch.Tensor:
    """q, k, v (B, H, T, D) (and gates) -> (B, H, T, D): `kernel.prefill_attend` with the
    prompt's mask (pads read as zeros, as `Attention.forward` passes them), then
    `cache_prompt` of every slot; the cache remembers the pads."""
    keep = torch.arange(q.shape[2], device=q.device) >= pads[:, None]  # (B, T)
    q, k, v, *gates = (zero_padded_positions(x, keep) for x in (q, k, v, *gates))
    out = kernel.prefill_attend(q, k, v, cache, *gates, attention_mask=keep)  # (B, H, T, D)
    kernel.cache_prompt(q, k, v, cache, *gates)
    cache.pads = pads
    return zero_padded_queries(out, keep)
