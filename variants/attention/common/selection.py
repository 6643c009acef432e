"""Which key blocks a MoBA (or NSA selected-branch) query attends to besides its own: the
`slots` blocks whose summary (mean key) scores highest with it, for a whole sequence
(`top_blocks`) or the newest position of a decoding cache (`attend_selected`), and the analytic
pair counts for `flops()`. Under the kernel contract's masks (`masking`), `DocumentBlocks` says
where the blocks lie among the documents and padding, and `DocumentRouting` is MoBA's routing
over the query's own document's real keys (`top_blocks`' `adjust`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from variants.attention.common.cache import BlockKVCache
from variants.attention.common.masking import repeat_kv
from variants.attention.common.pooling import (
    block_counts,
    piece_mean,
    real_block_mean,
    real_weight,
)

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


Adjust = Callable[[slice, torch.Tensor], torch.Tensor]


def top_blocks(
    q: torch.Tensor,
    summaries: torch.Tensor,
    block: int,
    slots: int,
    causal: bool,
    adjust: Adjust | None = None,
    per_group: bool = False,
) -> torch.Tensor:
    """The `slots` highest-scoring other blocks per query, no autograd.

    q: (B, H, L, D); summaries: (B, H_kv, n, D), one vector per key block (mean key, compressed
    key), H_kv dividing H (grouped KV heads: query head h scores KV head h // (H / H_kv)'s).
    Candidates: causally the blocks before the query's own block (c < floor(i / b)), else
    every block but its own. Score q_i . summary_c (a softmax over the same scores ranks
    the same). `adjust(rows, scores)`, if given, returns a range of rows' scores (B, H, r, c)
    changed before the rule above applies (masks: other documents' and empty blocks at -inf,
    `DocumentBlocks.hide_outside`, `DocumentRouting.adjust`). Returns (B, H, L, slots) int64
    block indices, best first, -1 in slots beyond the query's number of candidates.

    `per_group` (causal only; grouped KV heads, else it changes nothing): one choice per GQA
    group, NSA's: the score of a block is the sum over the group's query heads of its
    probability in that head's softmax over the blocks ended by i ((c + 1) b - 1 <= i, the own
    block once it has just ended; scale 1/sqrt(D), the scores after `adjust`), and every head
    of the group gets the group's blocks.
    """
    batch, heads, length, dim = q.shape
    n_blocks, group = summaries.shape[2], heads // summaries.shape[1]
    per_group = per_group and group > 1
    if per_group and not causal:
        raise ValueError("top_blocks: per_group selection is defined causally only")
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
        # A group's probabilities are normalised over every ended block, its last own one too.
        scored = min(rows.stop // block, n_blocks) if per_group else count
        scores = _scores(q[:, :, rows], summaries[:, :, :scored])  # (B, H, r, c)
        if adjust is not None:
            scores = adjust(rows, scores)
        if per_group:
            scores = _group_probabilities(scores, rows, block, group, dim)[..., :count]
        own = (torch.arange(rows.start, rows.stop, device=q.device) // block)[:, None]  # (r, 1)
        block_ids = torch.arange(count, device=q.device)
        hidden = block_ids >= own if causal else block_ids == own  # (r, c)
        scores.masked_fill_(hidden, float("-inf"))
        best, index = scores.topk(take, dim=-1)  # (B, H or H_kv, r, take) each
        index.masked_fill_(best == float("-inf"), -1)
        selected[:, :, rows, :take] = index.repeat_interleave(group, 1) if per_group else index
    return selected


def _group_probabilities(
    scores: torch.Tensor, rows: slice, block: int, group: int, dim: int
) -> torch.Tensor:
    """scores (B, H, r, c) of the query `rows` -> (B, H / group, r, c): per group of `group`
    query heads, the sum of each head's softmax probability (scale 1/sqrt(dim)) over the blocks
    ended by the row; -inf where no head of the group may see the block."""
    ended = (torch.arange(rows.start, rows.stop, device=scores.device) + 1) // block  # (r,)
    seen = torch.arange(scores.shape[-1], device=scores.device) < ended[:, None]  # (r, c)
    scaled = (scores * dim**-0.5).masked_fill_(~seen, float("-inf"))
    visible = (scaled > float("-inf")).unflatten(1, (-1, group)).any(dim=2)  # (B, H_kv, r, c)
    # A row that sees no block has no probabilities (0/0) and no candidate either.
    probabilities = torch.softmax(scaled, dim=-1).nan_to_num_(0.0)
    summed = probabilities.unflatten(1, (-1, group)).sum(dim=2)  # (B, H_kv, r, c)
    return summed.masked_fill_(~visible, float("-inf"))


def _scores(q: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """q (B, H, r, D) . summaries (B, H_kv, c, D) -> (B, H, r, c): a KV head's G query heads
    as G r rows of one matmul."""
    batch, heads, rows, dim = q.shape
    kv_heads = summaries.shape[1]
    if kv_heads == heads:
        return q @ summaries.transpose(-1, -2)
    grouped = q.reshape(batch, kv_heads, -1, dim) @ summaries.transpose(-1, -2)  # (B, H_kv, G r, c)
    return grouped.view(batch, heads, rows, -1)


def attend_selected(
    q: torch.Tensor,
    cache: BlockKVCache,
    summaries: torch.Tensor,
    slots: int,
    per_group: bool = False,
) -> torch.Tensor:
    """The newest position's query over its own block (up to itself) and the `slots` blocks
    before it whose summary scores highest with it (all of them if fewer), one softmax (scale
    1/sqrt(d)): the causal rule of `top_blocks` and `SelectedBlocks` for one query.

    q: (B, H, 1, D); the cache and summaries (B, H_kv, n, D) of H_kv heads dividing H (grouped
    KV heads: each query head gathers its chosen blocks from its KV head), summaries at least
    the blocks before the query's own (blocks from its own on are left out; with `per_group`,
    every block ended by the query, which normalise its probabilities). `per_group`:
    `top_blocks`' choice per GQA group.
    Returns (B, H, 1, D).
    """
    block = cache.block
    own = (cache.length - 1) // block  # the query's block
    keys, values = cache.keys(), cache.values()  # (B, H_kv, length, D) views
    start = own * block
    own_keys, own_values = keys[:, :, start:], values[:, :, start:]  # (B, H_kv, i - start + 1, D)
    grouped = keys.shape[1] != q.shape[1]
    slots = min(slots, own)
    if slots <= 0:
        return F.scaled_dot_product_attention(q, own_keys, own_values, enable_gqa=grouped)
    group = q.shape[1] // keys.shape[1]
    if per_group and group > 1:  # summed over each group's heads, every ended block seen
        at = slice(cache.length - 1, cache.length)
        scores = _scores(q, summaries)  # (B, H, 1, n)
        scores = _group_probabilities(scores, at, block, group, q.shape[-1])[..., :own]
        chosen = scores.topk(slots, dim=-1).indices.squeeze(2).repeat_interleave(group, 1)
    else:
        scores = _scores(q, summaries[:, :, :own])  # (B, H, 1, own)
        chosen = scores.topk(slots, dim=-1).indices.squeeze(2)  # (B, H, S)
    offsets = torch.arange(block, device=q.device)
    positions = (chosen[..., None] * block + offsets).flatten(2)  # (B, H, S*b)
    if grouped:  # query head h's blocks, from KV head h // G: one (B, H_kv * length) axis
        length = keys.shape[2]
        kv_head = torch.arange(q.shape[1], device=q.device) // group  # (H,)
        positions = (positions + (kv_head * length)[:, None]).flatten(1)  # (B, H*S*b)
        keys, values = keys.flatten(1, 2), values.flatten(1, 2)  # (B, H_kv*length, D)
        own_keys, own_values = (repeat_kv(x, q.shape[1]) for x in (own_keys, own_values))
    index = positions[..., None].expand(*positions.shape, q.shape[-1])  # (B, [H,] S*b, D)
    picked = [x.gather(-2, index).view(*q.shape[:2], -1, q.shape[-1]) for x in (keys, values)]
    picked_keys = torch.cat([picked[0], own_keys], dim=2)  # (B, H, S*b + own, D)
    picked_values = torch.cat([picked[1], own_values], dim=2)
    return F.scaled_dot_product_attention(q, picked_keys, picked_values)  # (B, H, 1, D)


class DocumentBlocks:
    """Where a call's key blocks of `block` lie among its documents and padding.

    attention_mask, segment_ids: (B, L) or None (not both; `masking`). Per block (B, n): the
    document of its first and of its last position, and its number of real positions.
    """

    def __init__(self, attention_mask, segment_ids, length: int, block: int):
        some = attention_mask if attention_mask is not None else segment_ids
        device = some.device
        if segment_ids is None:
            segment_ids = torch.zeros(some.shape, dtype=torch.long, device=device)
        self.segments = segment_ids  # (B, L)
        self.keep = attention_mask  # (B, L) or None
        starts = torch.arange(0, length, block, device=device)  # (n,)
        last = (starts + block).clamp(max=length) - 1
        self.first_doc, self.last_doc = segment_ids[:, starts], segment_ids[:, last]  # (B, n)
        weight = real_weight(attention_mask, some.shape[0], length, torch.float32, device)
        self.real = block_counts(weight, block)  # (B, n)

    def whole(self, rows: slice, count: int) -> torch.Tensor:
        """(B, r, count) bool: block c (of the first `count`) lies wholly in the document of
        query i (of `rows`) and holds a real key."""
        doc = self.segments[:, rows, None]  # (B, r, 1)
        first, last = self.first_doc[:, None, :count], self.last_doc[:, None, :count]
        return (first == doc) & (last == doc) & (self.real[:, None, :count] > 0)

    def outside(self, rows: slice, count: int) -> torch.Tensor:
        """(B, r, count) bool: the blocks not `whole` for the real queries of `rows`; a padded
        query's row hides none (its output is 0 whatever it reads)."""
        hidden = ~self.whole(rows, count)
        if self.keep is not None:
            hidden &= self.keep[:, rows, None]
        return hidden

    def hide_outside(self, rows: slice, scores: torch.Tensor) -> torch.Tensor:
        """`top_blocks`' adjust: scores (B, H, r, c) at -inf but for the blocks `whole`."""
        inside = self.whole(rows, scores.shape[-1])[:, None]  # (B, 1, r, c)
        return scores.masked_fill_(~inside, float("-inf"))


class DocumentRouting:
    """MoBA's routing under masks: query i scores block c by the mean of the block's real keys
    of i's own document, and never picks a block without one.

    A block wholly inside i's document is scored by its real keys' mean (`summaries`, one per
    block). The only other blocks holding keys of i's document are the two where that document
    starts and ends; for those `adjust` puts in q_i . (mean of the document's real keys in the
    block), a piece mean per query (`pooling.piece_mean`). So a document's routing never reads
    another document's keys or a padded key.

    q: (B, H, L, D); k: (B, H_kv, L, D) (grouped KV heads: the summaries are per KV head);
    attention_mask, segment_ids: (B, L) or None (not both).
    """

    def __init__(self, q, k, block: int, attention_mask=None, segment_ids=None):
        self.docs = DocumentBlocks(attention_mask, segment_ids, k.shape[2], block)
        self.summaries, _ = real_block_mean(k, block, attention_mask)  # (B, H_kv, n, D)
        self.block = block
        self.edges = []  # per edge: its block (B, L), q_i . piece mean (B, H, L), real (B, L)
        if segment_ids is not None:
            means, counts = piece_mean(k, block, attention_mask, segment_ids)
            for at in _document_edges(segment_ids):  # (B, L) positions each
                index = at[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
                mean = means.gather(2, index)  # (B, H_kv, L, D): each query's edge piece mean
                score = _edge_scores(q, mean)  # (B, H, L)
                self.edges.append((at // block, score, counts.gather(1, at) > 0))

    def adjust(self, rows: slice, scores: torch.Tensor) -> torch.Tensor:
        """`top_blocks`' adjust: scores (B, H, r, c) with the edge blocks' piece scores in
        and every block without a real key of the query's document at -inf."""
        count = scores.shape[-1]
        allowed = self.docs.whole(rows, count)  # (B, r, c)
        column = torch.arange(count, device=scores.device)
        for block, score, real in self.edges:
            at = column == block[:, rows, None]  # (B, r, c)
            scores = torch.where(at[:, None], score[:, :, rows, None], scores)
            allowed = allowed | (at & real[:, rows, None])
        return scores.masked_fill_(~allowed[:, None], float("-inf"))


def _edge_scores(q: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """q (B, H, L, D) . mean (B, H_kv, L, D) position by position -> (B, H, L)."""
    if mean.shape[1] == q.shape[1]:
        return (q * mean).sum(dim=-1)
    grouped = q.unflatten(1, (mean.shape[1], -1)) * mean[:, :, None]  # (B, H_kv, G, L, D)
    return grouped.sum(dim=-1).flatten(1, 2)


def _document_edges(segment_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the first and the last position of its document: (B, L) int64 each
    (segment_ids (B, L) non-decreasing)."""
    ids = segment_ids.contiguous()
    first = torch.searchsorted(ids, ids, right=False)
    last = torch.searchsorted(ids, ids, right=True) - 1
    return first, last
