"""Which key blocks a MoBA (or NSA selected-branch) query attends to besides its own: the
`slots` blocks whose summary (mean key) scores highest with it, for a whole sequence
(`top_blocks`) or the newest position of a decoding cache (`attend_selected`), and the analytic
pair counts for `flops()`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.common.cache import BlockKVCache

# Queries scored against the block means at a time (the routing scores are (B, H, rows, n);
# causally only the blocks before the rows' last own block: shorter ranges skip more).
SCORE_ROWS = 1024


def block_select_pairs(seq_len: int, block: int, top_k: int, causal: bool) -> tuple[int, int]:
    """(query, key) pairs a query-selects-blocks kernel scores, own block included, and the
    (query, candidate block) pairs of its routing, for full blocks of `block` (the short last
    block counts its real keys); an analytic count for `flops()`."""
    n_blocks = -(-seq_len // block)
    sizes = [min(block, seq_len - c * block) for c in range(n_blocks)]
    pairs = candidates = 0
    for c, size in enumerate(sizes):
        own = size * (size + 1) // 2 if causal else size * size
        if causal:
            n_other = min(top_k - 1, c)
            other_keys = n_other * block  # earlier blocks are full
            n_candidates = c
        else:
            n_other = min(top_k - 1, n_blocks - 1)
            # The top blocks depend on the data; count full blocks (the short one at most once).
            other_keys = n_other * block
            n_candidates = n_blocks - 1
        pairs += own + size * other_keys
        candidates += size * n_candidates
    return pairs, candidates


def top_blocks(
    q: torch.Tensor, summaries: torch.Tensor, block: int, slots: int, causal: bool
) -> torch.Tensor:
    """The `slots` highest-scoring other blocks per query, no autograd.

    q: (B, H, L, D); summaries: (B, H, n, D), one vector per key block (mean key, compressed
    key). Candidates: causally the blocks before the query's own block (c < floor(i / b)),
    else every block but its own. Score q_i . summary_c (a softmax over the same scores ranks
    the same). Returns (B, H, L, slots) int64 block indices, best first, -1 in slots beyond the
    query's number of candidates.
    """
    batch, heads, length, _ = q.shape
    n_blocks = summaries.shape[2]
    slots = min(slots, n_blocks - 1)
    selected = torch.full((batch, heads, length, max(slots, 0)), -1, dtype=torch.long)
    selected = selected.to(q.device)
    if slots <= 0:
        return selected
    for first in range(0, length, SCORE_ROWS):
        rows = slice(first, min(first + SCORE_ROWS, length))
        # Causally no row of the range sees a block from its last row's own block on.
        count = (rows.stop - 1) // block if causal else n_blocks
        take = min(slots, count)
        if take <= 0:
            continue
        scores = q[:, :, rows] @ summaries[:, :, :count].transpose(-1, -2)  # (B, H, r, c)
        own = (torch.arange(rows.start, rows.stop, device=q.device) // block)[:, None]  # (r, 1)
        block_ids = torch.arange(count, device=q.device)
        hidden = block_ids >= own if causal else block_ids == own  # (r, c)
        scores.masked_fill_(hidden, float("-inf"))
        best, index = scores.topk(take, dim=-1)  # (B, H, r, take) each
        selected[:, :, rows, :take] = index.masked_fill_(best == float("-inf"), -1)
    return selected


def attend_selected(
    q: torch.Tensor, cache: BlockKVCache, summaries: torch.Tensor, slots: int
) -> torch.Tensor:
    """The newest position's query over its own block (up to itself) and the `slots` blocks
    before it whose summary scores highest with it (all of them if fewer), one softmax (scale
    1/sqrt(d)): the causal rule of `top_blocks` and `SelectedBlocks` for one query.

    q: (B, H, 1, D); summaries: (B, H, n, D), at least the blocks before the query's own
    (blocks from its own on are left out). Returns (B, H, 1, D).
    """
    block = cache.block
    own = (cache.length - 1) // block  # the query's block
    keys, values = cache.keys(), cache.values()  # (B, H, length, D) views
    start = own * block
    own_keys, own_values = keys[:, :, start:], values[:, :, start:]  # (B, H, i - start + 1, D)
    slots = min(slots, own)
    if slots <= 0:
        return F.scaled_dot_product_attention(q, own_keys, own_values)
    scores = q @ summaries[:, :, :own].transpose(-1, -2)  # (B, H, 1, own)
    chosen = scores.topk(slots, dim=-1).indices.squeeze(2)  # (B, H, S)
    offsets = torch.arange(block, device=q.device)
    positions = (chosen[..., None] * block + offsets).flatten(2)  # (B, H, S*b)
    index = positions[..., None].expand(-1, -1, -1, q.shape[-1])  # (B, H, S*b, D)
    picked_keys = torch.cat([keys.gather(2, index), own_keys], dim=2)
    picked_values = torch.cat([values.gather(2, index), own_values], dim=2)
    return F.scaled_dot_product_attention(q, picked_keys, picked_values)  # (B, H, 1, D)
