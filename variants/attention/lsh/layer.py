"""Reformer's LSH attention, the layer: shared-QK keys hashed into angular buckets, sorted and
chunked. This module holds the registry's `LSHAttention` and its decoding cache; beside it
`hashing`, `function`, `bucket_windows` and `masks` (the package's docstring says each one's
role) and `common.buffers` (how the work is cut so its temporaries stay small).

Each of `n_hashes` rounds hashes every position into one of `n_buckets` buckets, sorts by
(bucket, position), cuts the sorted sequence into chunks of m = `bucket_size`, and every chunk
attends to itself and the previous chunk of its round; the rounds are combined by logsumexp.
Keys are the unit-normalised queries (scores q . k_hat), a token attends to itself only when it
has no other key, and with `dedup=True` a pair met in several rounds counts once. Time and
memory are linear in L. Causally no later key or value is read, but later tokens' hashes move
the chunk boundaries (`past_fixed = False`). Masks: no query attends across a document or to a
padded key; a query with no allowed key attends to itself alone.

The choices where implementations differ, the cost and the masks in full: docs/variants/lsh.md.
"""

from __future__ import annotations

import math

import torch

from variants.attention.common.base import (
    Attention,
    is_replaying,
    masked_attend,
    norm_floor,
    pad_to_multiple,
)
from variants.attention.common.buffers import index_dtype
from variants.attention.common.cache import KVCache
from variants.attention.common.masking import SequenceDocuments
from variants.attention.lsh.function import RoundsWindowAttention
from variants.attention.lsh.hashing import angular_hash, hash_factors
from variants.attention.lsh.masks import hidden_keys
from variants.checks import require_bool, require_non_negative_int, require_positive_int
from variants.registry import register_attention


@register_attention
class LSHAttention(Attention):
    """Reformer LSH attention: shared-QK angular hashing, chunks of sorted buckets, n rounds.

    The `k` argument is ignored: keys are the unit-normalised queries. The model passes
    shared-QK projections (q = k) because this variant declares `shared_qk_required`.
    The buckets of the last forward are kept in `last_buckets`, (batch, heads, n_hashes,
    padded seq_len), int16 or int32; inside `base.replaying()` a forward reuses them instead
    of hashing anew, so that a reversible or checkpointed recompute sees the same buckets.

    Causally the past is not fixed (`past_fixed = False`): appended tokens, and the
    default n_buckets of 2 L / m, move the chunk boundaries of the global sort, so the outputs
    at earlier positions change with what follows (docs/variants/lsh.md, "Causal").
    """

    family = "learnable"
    takes_scale = True
    small_options = {"bucket_size": 8, "n_hashes": 2}
    past_fixed = False
    past_fixed_reason = "later tokens move the sorted chunks' boundaries (its decode: own rule)"
    knobs = ("n_hashes", "bucket_size")

    name = "lsh"
    published_as = {"lra": "Reformer"}
    exact = False
    time_complexity = "O(n_hashes L m d)"
    memory_complexity = "O(n_hashes L m)"
    softmax_kernels = "flash"
    shared_qk_required = True
    supports_gqa = False
    gqa_reason = "its keys are the unit-normalised queries (shared QK), one per query head"
    supports_decode = True
    supports_padding_mask = supports_segments = True  # masked inside the windows
    decode_matches_forward = False

    def __init__(
        self,
        *,
        causal: bool = False,
        n_hashes: int = 4,
        bucket_size: int = 64,
        n_buckets: int | None = None,
        seed: int | None = None,
        dedup: bool = True,
    ):
        super().__init__(causal=causal)
        self.n_hashes = require_positive_int(self.name, "n_hashes", n_hashes)
        self.bucket_size = require_positive_int(self.name, "bucket_size", bucket_size)
        if n_buckets is not None:
            require_positive_int(self.name, "n_buckets", n_buckets)
            if n_buckets % 2:
                raise ValueError(
                    f"{self.name}: option 'n_buckets' must be even (buckets are the argmax "
                    f"over [xR; -xR]), got {n_buckets!r}"
                )
        self.n_buckets = n_buckets
        self.seed = None if seed is None else require_non_negative_int(self.name, "seed", seed)
        self.dedup = require_bool(self.name, "dedup", dedup)
        self.last_buckets: torch.Tensor | None = None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, v: (B, H, L, D) -> (B, H, L, D); masks (B, L) as `Attention.forward` takes them
        (docs/variants/lsh.md, "Padding and masks": masked inside the windows, padded tokens in
        the padding bucket)."""
        batch, heads, length, head_dim = q.shape
        q = pad_to_multiple(q, self.bucket_size)  # (B, H, Lp, D)
        v = pad_to_multiple(v, self.bucket_size)  # (B, H, Lp, D)
        padded = q.shape[2]
        documents = None
        if attention_mask is not None or segment_ids is not None:
            documents = SequenceDocuments(attention_mask, segment_ids, heads)

        buckets = self._buckets(q, length, attention_mask)  # (B, H, R, Lp)
        # Buckets are < n_buckets + 1 and positions < Lp, so this key orders by bucket and then
        # by position with a single argsort (its keys are unique, so stability is moot).
        positions = torch.arange(padded, device=q.device)
        order = (buckets * padded + positions).argsort(dim=-1)  # (B, H, R, Lp) position per slot
        slot = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))  # (B,H,R,Lp)
        order, slot = order.flatten(0, 1), slot.flatten(0, 1)  # (B*H, R, Lp) each
        hidden = hidden_keys(
            order,
            slot,
            length,
            self.bucket_size,
            causal=self.causal,
            dedup=self.dedup,
            documents=documents,
        )  # (B*H, R, C, m or 1, W*m), a RoundMasks, or None
        out = RoundsWindowAttention.apply(
            q.flatten(0, 1), v.flatten(0, 1), hidden, order, slot, self.bucket_size
        )  # (B*H, Lp, D)
        return out.view(batch, heads, padded, head_dim)[:, :, :length]  # (B, H, L, D)

    def _buckets(
        self, q: torch.Tensor, length: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bucket of every position in every round, (B, H, R, Lp) int64; cached for replays.

        q: (B, H, Lp, D), zero-padded after `length`. Padded positions (after `length`, and
        where attention_mask (B, L) is False) get bucket n_buckets.
        """
        batch, heads, padded, head_dim = q.shape
        n_buckets = self.n_buckets or 2 * padded // self.bucket_size
        factors = hash_factors(n_buckets)
        # Drawn even when replaying: the recompute restores the RNG state of the forward, and
        # the dropout after this kernel must draw the same mask, so the draws must match too.
        columns = sum(n // 2 for n in factors)
        rotations = self._rotations(head_dim, columns, q)  # (D, R, sum of n_f / 2)
        cached = self.last_buckets
        replayable = cached is not None and cached.shape == (batch, heads, self.n_hashes, padded)
        if is_replaying() and replayable:
            return cached.long()
        buckets = angular_hash(q.detach(), rotations, factors)  # (B, H, R, Lp)
        # Monotone onto exactly n_buckets: neighbouring product buckets merge when the factors'
        # product overshoots, which keeps similar vectors adjacent in the sort.
        buckets = buckets * n_buckets // math.prod(factors)
        buckets[..., length:] = n_buckets
        if attention_mask is not None:
            padding = ~attention_mask[:, None, None, :]  # (B, 1, 1, L)
            buckets[..., :length].masked_fill_(padding, n_buckets)
        # Kept in the narrowest integer type: every layer holds its buckets until its backward,
        # so at depth 12 int64 buckets were a quarter of a reversible stack's growth over depth 1.
        self.last_buckets = buckets.to(index_dtype(n_buckets + 1))
        return buckets

    def _rotations(self, head_dim: int, columns: int, like: torch.Tensor) -> torch.Tensor:
        """Random rotation (D, n_hashes, columns) on `like`'s device and dtype; seeded if `seed`.

        A seeded rotation is drawn on the CPU and moved, so one seed hashes alike on every
        device (CUDA's generator draws other numbers from the same seed).
        """
        shape = (head_dim, self.n_hashes, columns)
        if self.seed is None:
            return torch.randn(shape, device=like.device, dtype=like.dtype)
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn(shape, generator=generator).to(device=like.device, dtype=like.dtype)

    # --- decoding -----------------------------------------------------------------------------
    # The forward's chunks of a global sort move with later tokens, so decoding has its own
    # rule (`decode_step`) and `decode_matches_forward` is False.
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return LSHCache(self, batch_size, n_heads, head_dim, max_len, device, dtype)

    def cache_prompt(self, q, k, v, cache: LSHCache) -> None:
        cache.append(q, v)

    def decode_step(self, q, k, v, cache: LSHCache) -> torch.Tensor:
        """The decode rule: the new query attends to every earlier cached key that shares its
        bucket in at least one round (hashed with the cache's rotations, n_buckets taken at
        max_len), scores q . k_hat. With `dedup` (default) that is one softmax over the union
        of the rounds' keys (each pair once, as the forward's dedup); without, one softmax per
        round, combined by the rounds' logsumexps as the forward combines them (a key shared
        by r rounds counts r times). A query with no such key attends to itself, the forward's
        rule for a token with no other target. O(n L) per token: every cached bucket is
        compared and the scores are computed for every cached key."""
        cache.append(q, v)
        last = cache.length - 1
        keys, values = cache.keys()[:, :, :last], cache.values()[:, :, :last]  # (B, H, i, D)
        same = cache.buckets[..., :last] == cache.buckets[..., last : last + 1]  # (B,H,R,i)
        if self.dedup or self.n_hashes == 1:
            out, lse = masked_attend(q, keys, values, same.any(dim=2)[:, :, None], scale=1.0)
        else:
            out_r, lse_r = masked_attend(
                q[:, :, None], keys[:, :, None], values[:, :, None], same[:, :, :, None], scale=1.0
            )  # (B, H, R, 1, D), (B, H, R, 1)
            lse = lse_r.logsumexp(dim=2)  # (B, H, 1)
            weights = (lse_r - torch.where(lse.isfinite(), lse, 0)[:, :, None]).exp()
            out = (weights.unsqueeze(-1) * out_r).sum(dim=2)  # (B, H, 1, D)
        alone = ~lse.isfinite()[..., None]  # (B, H, 1, 1): no key shares a bucket
        return torch.where(alone, v, out)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        # Scores and values over each query's window (2m keys, m with a single chunk) in every
        # round. Causal masking hides a data-dependent part of the window, so the whole window
        # is counted; hashing, O(n_hashes L n_buckets d), is not (docs/variants/lsh.md, "Speed").
        padded = -(-seq_len // self.bucket_size) * self.bucket_size
        window_keys = self.bucket_size * min(2, padded // self.bucket_size)
        return 4 * batch * heads * self.n_hashes * padded * window_keys * head_dim

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, n_hashes={self.n_hashes}, bucket_size={self.bucket_size}, "
            f"n_buckets={self.n_buckets}, seed={self.seed}, dedup={self.dedup}"
        )


class LSHCache(KVCache):
    """LSH's decoding cache: unit keys (q / |q|) and values of every position, each position's
    bucket in every round (B, H, R, max_len), and the rotations they were hashed with, drawn
    once per cache (from the global RNG, or from `seed`); n_buckets as the forward's at
    max_len."""

    def __init__(self, lsh: LSHAttention, batch, heads, head_dim, max_len, device, dtype):
        super().__init__(
            lsh.name, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype
        )
        padded = -(-max_len // lsh.bucket_size) * lsh.bucket_size
        self.n_buckets = lsh.n_buckets or 2 * padded // lsh.bucket_size
        self.factors = hash_factors(self.n_buckets)
        like = self.keys_buffer
        self.rotations = lsh._rotations(head_dim, sum(n // 2 for n in self.factors), like)
        rounds = lsh.n_hashes
        self.buckets = torch.empty(batch, heads, rounds, max_len, dtype=torch.long, device=device)

    def append(self, q: torch.Tensor, v: torch.Tensor) -> None:
        """q, v: (B, H, T, D): their unit keys, values and buckets."""
        first = self.length
        unit = q / q.norm(dim=-1, keepdim=True).clamp_min(norm_floor(q.dtype))
        super().append(unit, v)
        buckets = angular_hash(q, self.rotations, self.factors)  # (B, H, R, T)
        buckets = buckets * self.n_buckets // math.prod(self.factors)
        self.buckets[..., first : self.length] = buckets

    @property
    def nbytes(self) -> int:
        per_position = self.buckets.shape[0] * self.buckets.shape[1] * self.buckets.shape[2]
        return super().nbytes + per_position * self.length * self.buckets.element_size()
