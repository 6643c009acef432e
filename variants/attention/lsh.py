"""Reformer's LSH attention: shared-QK keys hashed into angular buckets, sorted and chunked.

Each of `n_hashes` rounds hashes every position into one of `n_buckets` buckets, sorts the
positions by (bucket, position), cuts the sorted sequence into chunks of m = `bucket_size` and
lets every chunk attend to itself and to the previous chunk of its round (the first chunk wraps
around to the round's last). The rounds are then combined with their logsumexp weights,
o = sum_r exp(lse_r - logsumexp_r lse_r) o_r. A query scores at most 2m keys per round, so time
and memory are linear in L.

Choices where published implementations differ:
- Keys are the unit-normalised queries (shared QK) and scores are q . k_hat, as in the
  Reformer's own code (trax RMS-normalises keys to norm sqrt(d), then applies the usual
  1/sqrt(d)); a widely used PyTorch port divides by a further sqrt(d), which measured 9 % worse
  bits per byte here (see `base.shared_qk_keys`).
- Hash: one random rotation R per round, drawn per forward and shared by every batch row and
  head (the vectors are still hashed independently; only the projection is shared), bucket =
  argmax([xR; -xR]). Fresh from the global RNG each call, or the same every call when `seed` is
  set. `n_buckets` defaults to the paper's 2 L/m, about two buckets per chunk.
  Deviation above SINGLE_HASH_MAX_BUCKETS (128) buckets, i.e. beyond L = 4096 with the defaults:
  a bucket is the pair of two independent angular hashes of about sqrt(n_buckets) buckets
  each (the classic LSH concatenation; collision probability the product of the two), mapped
  monotonically onto exactly n_buckets. One rotation of n_buckets/2 columns would cost
  n_hashes L d n_buckets multiply-adds, O(L^2 d / m) with the default count: at 32K that is
  4.5x the attention's own forward+backward FLOPs. The pair costs O(L d sqrt(L / m)).
- Self: a token attends to itself only when it has no other key. The paper (and trax)
  subtract 1e5 from its score; we put it SELF_MARGIN (100) below the lowest score any other
  key can reach, -|q| (see `window_bias`): the same outputs, without float32 losing the
  digits of a score near -1e5 in the backward's exp(score - logsumexp).
- How pairs that collide in several rounds are counted: with `dedup=True` (the default) a
  (query, key) pair counts once however many rounds put the key in the query's window, so the
  combined output is exactly a softmax over the union of the windows, as in the Reformer's own
  trax code. Trax lowers the pair's score by log(number of such rounds) in each of them; we
  count it in the first round that offers it and mask it in the later ones, which gives the
  same output (each pair's exp(score) enters the combined sum once either way) with a mask
  instead of a division, and compares chunk indices only against earlier rounds. With
  `dedup=False` a pair counts once per round it collides in (cheaper; as a widely used public
  implementation). No key is ever twice in one window: a single chunk is attended once, and
  with two chunks the wrap-around brings the other chunk, not a copy.
- Causal: keys after the query are masked, so no later key or value is ever read. The sort is
  global, though: a later token's bucket can move chunk boundaries and so change *which*
  earlier keys share a query's window. Outputs at positions <= t therefore depend on the hashes
  of tokens after t (not on their values); with buckets replayed they do not. This is inherent
  in the Reformer's causal LSH.

Speed: the per-chunk attention runs on PyTorch's fused CPU flash-attention kernels (forward
and backward) with an additive mask, chunks playing the role of heads; the rounds are combined
inside the same autograd Function, so its backward is a flash backward per round (over ranges
of chunks) given the combined output and logsumexp (`RoundsWindowAttention`). Other devices
take explicit matmuls.
Both directions sort, attend and unsort one round of as many sequences at a time as keep the
window temporaries within SLICE_BYTES (one sequence at least: 16 MiB each at 32K tokens, 32 MiB
at 64K, with m = d = 64 in float32): on CPU, memory blocks above glibc's mmap threshold come
back as fresh pages on every call, and faulting them in took as long as the attention itself.

A length that is not a multiple of m is padded; padded positions hash into an extra last bucket
(so they sort to the end of every round), are never keys, and their outputs are dropped.

Hashing (no gradient) costs n_hashes * L * d * (sum of the factors' bucket counts / 2)
multiply-adds: below the attention's own matmuls at every length. `flops` counts only the
attention matmuls.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from variants.attention import flash
from variants.attention.base import (
    SHARED_QK_NORM_EPS,
    Attention,
    is_replaying,
    masked_attend,
    pad_to_multiple,
)
from variants.attention.cache import KVCache
from variants.checks import require_bool, require_non_negative_int, require_positive_int
from variants.registry import register_attention

# How far below every other key a token's own score is put (see `window_bias`): finite, unlike
# a masked score, so a row whose other keys are all masked falls back to the token itself, and
# exp(-100) vanishes next to any real key (underflow in float32, 4e-44 in float64).
SELF_MARGIN = 100.0
# Bytes of the largest window temporary of one slice (see `sequence_slices`). Kept well under
# glibc's 32 MiB ceiling for its mmap threshold: larger blocks are mmapped fresh on every call
# and their pages fault in again (a fresh 32 MiB tensor took 10x the time of a reused one
# here), smaller ones are reused from the heap. 2**18 rows per slice instead made LSH's
# forward+backward 1.5-2x slower at 8K-16K, with half its time in the kernel.
SLICE_BYTES = 16 * 2**20
# Up to this many buckets the hash is one angular hash, as in the paper; beyond, see hash_factors.
SINGLE_HASH_MAX_BUCKETS = 128
# Bytes of the key and value window gradients of one flash backward call (see `chunk_pieces`).
# The CPU backward kernel zero-fills its gradient outputs, and at 16 MiB (one 32K sequence)
# those came back as fresh pages on every call: the fill took a third of the backward's time.
# One 32K sequence in one call took 50-80 ms, in four calls of 4 MiB 35 ms. The same budget
# bounds the hash's projection blocks and the groups of sequences the masks are built for.
PIECE_BYTES = 4 * 2**20
# Bytes of the whole uint8 window mask (B*H*n_hashes*L*2m) above which it is not held: each
# slice and round's part is rebuilt when forward and backward need it (`RoundMasks`). Up to
# this, the whole mask is built once and saved, as below 2^17 tokens at 4 heads with the
# defaults (64 MiB at 32K): rebuilding per slice measured 1.2-2x slower at 32K. At 2^20 tokens
# the whole mask would be 2 GiB.
MASK_BYTES = 256 * 2**20


@register_attention
class LSHAttention(Attention):
    """Reformer LSH attention: shared-QK angular hashing, chunks of sorted buckets, n rounds.

    The `k` argument is ignored: keys are the unit-normalised queries. The model passes
    shared-QK projections (q = k) because this variant declares `shared_qk_required`.
    The buckets of the last forward are kept in `last_buckets`, (batch, heads, n_hashes,
    padded seq_len), int16 or int32; inside `base.replaying()` a forward reuses them instead
    of hashing anew, so that a reversible or checkpointed recompute sees the same buckets.
    """

    name = "lsh"
    exact = False
    time_complexity = "O(n_hashes L m d)"
    memory_complexity = "O(n_hashes L m)"
    softmax_kernels = "flash"
    shared_qk_required = True
    supports_decode = True
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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, heads, length, head_dim = q.shape
        q = pad_to_multiple(q, self.bucket_size)  # (B, H, Lp, D)
        v = pad_to_multiple(v, self.bucket_size)  # (B, H, Lp, D)
        padded = q.shape[2]

        buckets = self._buckets(q, length)  # (B, H, R, Lp)
        # Buckets are < n_buckets + 1 and positions < Lp, so this key orders by bucket and then
        # by position with a single argsort (its keys are unique, so stability is moot).
        positions = torch.arange(padded, device=q.device)
        order = (buckets * padded + positions).argsort(dim=-1)  # (B, H, R, Lp) position per slot
        slot = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))  # (B,H,R,Lp)
        order, slot = order.flatten(0, 1), slot.flatten(0, 1)  # (B*H, R, Lp) each
        hidden = self._hidden_keys(order, slot, length)  # (B*H, R, C, m or 1, W*m) or None
        out = RoundsWindowAttention.apply(
            q.flatten(0, 1), v.flatten(0, 1), hidden, order, slot, self.bucket_size
        )  # (B*H, Lp, D)
        return out.view(batch, heads, padded, head_dim)[:, :, :length]  # (B, H, L, D)

    def _buckets(self, q: torch.Tensor, length: int) -> torch.Tensor:
        """Bucket of every position in every round, (B, H, R, Lp) int64; cached for replays.

        q: (B, H, Lp, D), zero-padded after `length`. Padded positions get bucket n_buckets.
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

    def _hidden_keys(
        self, order: torch.Tensor, slot: torch.Tensor, length: int
    ) -> torch.Tensor | RoundMasks | None:
        """Mask of the window keys each sorted query must not see (uint8, 1 = hidden), or None.

        order, slot: (S, R, Lp), S = B*H, as in `attend`. Hides later keys (causal) or padded
        keys, and with `dedup` pairs an earlier round already offers. Shape (S, R, C, m, W*m),
        or (S, R, C, 1, W*m) when only padding is hidden, laid out as `window_view`'s keys
        (previous chunk, then own). A whole (S, R, C, m, W*m) mask of more than MASK_BYTES is
        not built: a `RoundMasks` then builds each slice and round's part when it is needed.
        uint8 rather than bool, and int16 positions where they fit: on CPU, broadcast
        comparisons wrote uint8 4-6x as fast as bool (and int16 operands 2-3x as fast as
        int32), and `window_bias` turns uint8 into floats 4x as fast.
        """
        n_seq, rounds, padded = order.shape
        m = self.bucket_size
        n_chunks = padded // m
        # With one or two chunks every window is the whole sequence in every round: every pair
        # counts n_hashes times, which cancels in the softmax and in the round weights.
        dedup = self.dedup and rounds > 1 and n_chunks > 2
        if not (self.causal or dedup):
            if length == padded:
                return None
            pos = order.view(n_seq, rounds, n_chunks, m).to(index_dtype(padded))  # (S,R,C,m)
            return window_keys(pos).ge(length).to(torch.uint8)  # (S, R, C, 1, W*m)
        window = 1 if n_chunks == 1 else 2
        masks = RoundMasks(order, slot, length, m, causal=self.causal, dedup=dedup)
        if n_seq * rounds * padded * window * m > MASK_BYTES:
            return masks  # rebuilt per slice and round, in forward and again in backward
        hidden = torch.empty(
            n_seq, rounds, n_chunks, m, window * m, dtype=torch.uint8, device=order.device
        )
        # A few sequences and one round at a time, into the mask itself: temporaries the size
        # of the whole mask came back as fresh pages on every call (comparisons into uint8 go
        # through a bool temporary), and faulting them in cost as much as the comparisons.
        per_group = max(1, PIECE_BYTES // hidden[0, 0].numel())
        for start in range(0, n_seq, per_group):
            group = slice(start, start + per_group)
            same = torch.empty_like(hidden[group, 0])  # (g, C, m, W*m)
            for r in range(rounds):
                masks.fill(hidden[group, r], group, r, same)
        return hidden

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
        # is counted; hashing, O(n_hashes L n_buckets d), is not (see the module docstring).
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
        unit = q / q.norm(dim=-1, keepdim=True).clamp_min(SHARED_QK_NORM_EPS)
        super().append(unit, v)
        buckets = angular_hash(q, self.rotations, self.factors)  # (B, H, R, T)
        buckets = buckets * self.n_buckets // math.prod(self.factors)
        self.buckets[..., first : self.length] = buckets

    @property
    def nbytes(self) -> int:
        per_position = self.buckets.shape[0] * self.buckets.shape[1] * self.buckets.shape[2]
        return super().nbytes + per_position * self.length * self.buckets.element_size()


def hash_factors(n_buckets: int) -> tuple[int, ...]:
    """Bucket counts of the angular hashes whose concatenation buckets the vectors.

    One hash of n_buckets up to SINGLE_HASH_MAX_BUCKETS. Beyond, two independent hashes of
    about sqrt(n_buckets) buckets each (both even, product >= n_buckets): projecting onto
    n_buckets/2 columns would cost O(L^2 d / m) with the default count, more than the attention.
    """
    if n_buckets <= SINGLE_HASH_MAX_BUCKETS:
        return (n_buckets,)
    root = math.isqrt(n_buckets)
    # An exact even x even factorisation not too far from the square root (powers of two have
    # one), else the nearest even factors whose product overshoots a little.
    for first in range(root - root % 2, root // 2, -2):
        if n_buckets % (2 * first) == 0:
            return (first, n_buckets // first)
    first = 2 * max(1, round(math.sqrt(n_buckets) / 2))
    return (first, 2 * -(-n_buckets // (2 * first)))


def angular_hash(
    x: torch.Tensor, rotations: torch.Tensor, factors: tuple[int, ...]
) -> torch.Tensor:
    """Angular LSH: per round and factor n_f, argmax([xR_f; -xR_f]); the factors' buckets
    combine in mixed radix, the first most significant.

    x: (B, H, L, D); rotations: (D, R, sum_f n_f / 2), the factors' columns side by side.
    Returns (B, H, R, L) int64 buckets in [0, prod_f n_f). The largest of [xR; -xR] is the
    entry of xR largest in absolute value, taken in the second half when negative, so [xR; -xR]
    is never built. All rounds project in one matmul (the columns per round are at most
    SINGLE_HASH_MAX_BUCKETS / 2 or about sqrt(n_buckets)), in blocks of rows whose projection
    stays within PIECE_BYTES (projecting one 32K sequence at once, 16 MiB, faulted in fresh
    pages on every call).
    """
    *lead, head_dim = x.shape
    rounds, columns = rotations.shape[1], rotations.shape[2]
    rows = x.reshape(-1, head_dim)  # (N, D), N = B*H*L
    buckets = torch.empty(rows.shape[0], rounds, dtype=torch.int64, device=x.device)  # (N, R)
    block = max(1, PIECE_BYTES // (rounds * columns * x.element_size()))
    projection = rotations.flatten(1)  # (D, R * columns)
    with torch.no_grad():
        for start in range(0, rows.shape[0], block):
            projected = rows[start : start + block] @ projection  # (n, R * columns)
            projected = projected.view(-1, rounds, columns)  # (n, R, columns)
            parts = projected.split([n // 2 for n in factors], dim=-1)  # (n, R, n_f / 2) each
            bucket = None
            for part, n in zip(parts, factors, strict=True):
                index = part.abs().argmax(dim=-1, keepdim=True)  # (n, R, 1)
                negative = part.gather(-1, index) < 0  # (n, R, 1)
                factor_bucket = index.squeeze(-1) + negative.squeeze(-1) * (n // 2)  # (n, R)
                bucket = factor_bucket if bucket is None else bucket.mul_(n).add_(factor_bucket)
            buckets[start : start + block] = bucket
    return buckets.view(*lead, rounds).transpose(-1, -2).contiguous()  # (B, H, R, L)


def index_dtype(count: int) -> torch.dtype:
    """The narrowest integer type for indices 0 .. count - 1 (int16 or int32): the pairwise
    comparisons of positions and chunk indices run on it."""
    return torch.int16 if count - 1 <= torch.iinfo(torch.int16).max else torch.int32


class RoundsWindowAttention(torch.autograd.Function):
    """Every sorted chunk attends to its window (previous chunk, itself); rounds combined.

    Forward: per round, the sequence is sorted, each chunk's m queries attend over their
    window's keys with the additive `window_bias`, giving out_r and lse_r, which go back to
    position order and are folded into the running combination o = sum_r softmax_r(lse_r) out_r
    (the online-softmax update, one round at a time). Keys are the unit-normalised queries and
    scores q . k_hat (shared QK, no 1/sqrt(d)).

    Backward without a per-round softmax: o is a softmax over the union of the rounds' windows,
    so every pair's probability is exp(score - LSE) with the combined LSE = logsumexp_r lse_r,
    and the gradient of each round is a standard attention backward given the *combined* o and
    LSE (the flash-attention form: dS = P (dO V^T - rowsum(dO * o))).

    Memory: both directions work on slices of one round of a few sequences (`sequence_slices`),
    sorting them on the fly, so no sorted copy of the R rounds is held or saved: only q, v (in
    position order), their norms, the sort orders, the combined output and LSE and the uint8
    mask are saved. The
    windows are strided views of the sorted keys and values, gathered with the last chunk in
    front (`SortedRound.with_previous`), never m x 2m copies.
    On CPU the fused flash kernels run both directions (measured 1.5-2x faster than explicit
    matmul + softmax passes); elsewhere the explicit path of `flash.attend` does.
    """

    @staticmethod
    def forward(ctx, q, v, hidden, order, slot, m):
        """q, v: (S, Lp, D) in position order, S = B*H; hidden: uint8 (S, R, C, m or 1, W*m) keys
        a query must not see, a `RoundMasks` that builds them per slice and round, or None;
        order: (S, R, Lp) position at each sorted slot; slot: (S, R, Lp) sorted slot of each
        position; m: chunk length. Returns o (S, Lp, D)."""
        n_seq, rounds, padded = order.shape
        # Row gathers and the `out=` writes below want dense rows; one copy here, if any.
        q, v = q.contiguous(), v.contiguous()
        norm = q.norm(dim=-1, keepdim=True).clamp_min_(SHARED_QK_NORM_EPS)  # (S, Lp, 1)
        combined = torch.empty_like(q)  # (S, Lp, D)
        total_lse = None  # (S, Lp, 1), in the dtype the kernels return
        bias_buffer = ScratchBuffer(q)
        for part in sequence_slices(q, m, n_chunks=padded // m):
            for r in range(rounds):
                sorted_round = SortedRound(order[part, r], slot[part, r], m)
                q_rows = sorted_round.with_previous(q[part])  # (s, (W-1)*m + Lp, D)
                v_rows = sorted_round.with_previous(v[part])  # (s, (W-1)*m + Lp, D)
                norm_rows = sorted_round.with_previous(norm[part])  # (s, (W-1)*m + Lp, 1)
                unit_rows = q_rows * norm_rows.reciprocal()  # as in backward
                norm_r = sorted_round.own(norm_rows)  # (s, C, m, 1)
                q_r = sorted_round.own(q_rows)  # (s, C, m, D)
                keys, values = sorted_round.windows(unit_rows), sorted_round.windows(v_rows)
                bias = bias_buffer.view((*q_r.shape[:-1], keys.shape[2]))  # (s, C, m, W*m)
                window_bias(_round(hidden, part, r), norm_r, out=bias)
                out_r, lse_r = flash.attend(q_r, keys, values, bias=bias, scale=1.0)  # (s,C,m,[D])
                del keys, values, unit_rows
                unsort = sorted_round.unsort
                if r == 0:
                    unsort(out_r, out=combined[part])  # (s, Lp, D)
                    lse = unsort(lse_r.unsqueeze(-1))  # (s, Lp, 1)
                    continue
                # The online softmax over rounds: no difference of lse values is exponentiated
                # at more than ~2|q| + SELF_MARGIN (a self-only row), so float32 keeps its digits.
                lse_r = unsort(lse_r.unsqueeze(-1))  # (s, Lp, 1)
                flash.merge_into(combined[part], lse, unsort(out_r), lse_r)
            if total_lse is None:
                total_lse = lse.new_empty(*q.shape[:-1], 1)
            total_lse[part] = lse
        ctx.m = m
        # A RoundMasks (above MASK_BYTES) is kept as it is: it rebuilds the masks in backward.
        ctx.masks = hidden if isinstance(hidden, RoundMasks) else None
        if ctx.masks is not None:
            hidden = None
        ctx.save_for_backward(q, v, norm, hidden, order, slot, combined, total_lse)
        return combined  # (S, Lp, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_combined):
        q, v, norm, hidden, order, slot, combined, total_lse = ctx.saved_tensors
        if ctx.masks is not None:
            hidden = ctx.masks
        m, rounds = ctx.m, order.shape[1]
        grad_combined = grad_combined.contiguous()
        grad_q, grad_v = torch.empty_like(q), torch.empty_like(v)  # (S, Lp, D) each
        bias_buffer = ScratchBuffer(q)
        for part in sequence_slices(q, m, n_chunks=q.shape[1] // m):
            for r in range(rounds):
                sorted_round = SortedRound(order[part, r], slot[part, r], m)
                q_rows = sorted_round.with_previous(q[part])  # (s, (W-1)*m + Lp, D)
                v_rows = sorted_round.with_previous(v[part])  # (s, (W-1)*m + Lp, D)
                norm_rows = sorted_round.with_previous(norm[part])  # (s, (W-1)*m + Lp, 1)
                inv_norm_rows = norm_rows.reciprocal()
                unit_rows = q_rows * inv_norm_rows  # (s, (W-1)*m + Lp, D)
                q_r, unit = sorted_round.own(q_rows), sorted_round.own(unit_rows)  # (s,C,m,D)
                norm_r, inv_norm = sorted_round.own(norm_rows), sorted_round.own(inv_norm_rows)
                grad_out = sorted_round.sort(grad_combined[part])  # (s, C, m, D)
                out = sorted_round.sort(combined[part])  # (s, C, m, D)
                lse = sorted_round.sort(total_lse[part]).squeeze(-1)  # (s, C, m)
                keys, values = sorted_round.windows(unit_rows), sorted_round.windows(v_rows)
                hidden_r = _round(hidden, part, r)
                grad_unit, grad_v_r = WindowGradient(unit), WindowGradient(unit)
                grad_q_parts = []
                for chunks in chunk_pieces(q_r.shape, keys.shape[2], q.element_size()):
                    bias = bias_buffer.view((*q_r[:, chunks].shape[:-1], keys.shape[2]))
                    hidden_c = None if hidden_r is None else hidden_r[:, chunks]
                    window_bias(hidden_c, norm_r[:, chunks], out=bias)  # (s, c, m, W*m)
                    grad_q_c, grad_keys, grad_values = flash.attend_backward(
                        grad_out[:, chunks],
                        q_r[:, chunks],
                        keys[:, chunks],
                        values[:, chunks],
                        out[:, chunks],
                        lse[:, chunks],
                        bias=bias,
                        scale=1.0,
                    )  # (s, c, m, D), (s, c, W*m, D) twice
                    grad_q_parts.append((chunks, grad_q_c))
                    grad_unit.add(grad_keys, chunks)
                    grad_v_r.add(grad_values, chunks)
                del grad_out, out, grad_keys, grad_values
                grad_unit, grad_v_r = grad_unit.result(), grad_v_r.result()  # (s, C, m, D)
                # unit = q / |q|: the key role's gradient loses its radial part, divided by |q|.
                radial = (grad_unit * unit).sum(dim=-1, keepdim=True)  # (s, C, m, 1)
                tangent = grad_unit.sub_(unit.mul_(radial))  # (s, C, m, D)
                grad_q_r = torch.empty_like(tangent)  # (s, C, m, D)
                for chunks, grad_q_c in grad_q_parts:
                    torch.addcmul(
                        grad_q_c, tangent[:, chunks], inv_norm[:, chunks], out=grad_q_r[:, chunks]
                    )
                del grad_q_parts
                if r == 0:
                    sorted_round.unsort(grad_q_r, out=grad_q[part])
                    sorted_round.unsort(grad_v_r, out=grad_v[part])
                else:
                    grad_q[part] += sorted_round.unsort(grad_q_r)
                    grad_v[part] += sorted_round.unsort(grad_v_r)
        return grad_q, grad_v, None, None, None, None


class SortedRound:
    """The sort and unsort of one round of s sequences, for (s, Lp, E) tensors.

    order, slot: (s, Lp) position at each sorted slot and sorted slot of each position. All
    moves are row gathers: the gradient flows by gathering too, never by a scatter (on CPU
    PyTorch's index_add and scatter_add took 15 % of LSH's forward+backward at 4K, far more
    than gathers of the same rows).
    """

    def __init__(self, order: torch.Tensor, slot: torch.Tensor, m: int):
        n_seq, padded = order.shape
        self.n_seq, self.padded, self.m, self.n_chunks = n_seq, padded, m, padded // m
        start = torch.arange(n_seq, device=order.device).unsqueeze(-1) * padded  # (s, 1)
        sorted_rows = order + start  # (s, Lp)
        self.sorted_rows = sorted_rows.view(-1)  # (s*Lp,)
        self.position_rows = (slot + start).view(-1)  # (s*Lp,)
        # The last chunk's rows first: the previous chunk of the first chunk (wrap-around).
        if self.n_chunks > 1:
            sorted_rows = torch.cat([sorted_rows[:, -m:], sorted_rows], dim=1)  # (s, (C+1)*m)
        self.window_rows = sorted_rows.reshape(-1)  # (s * ((W-1)*m + Lp),)

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        """(s, Lp, E) -> (s, C, m, E) in the round's sorted order."""
        rows = x.reshape(-1, x.shape[-1]).index_select(0, self.sorted_rows)  # (s*Lp, E)
        return rows.view(self.n_seq, self.n_chunks, self.m, x.shape[-1])

    def with_previous(self, x: torch.Tensor) -> torch.Tensor:
        """(s, Lp, E) -> (s, (W-1)*m + Lp, E): sorted, the last chunk repeated in front, the
        layout `own` and `windows` view, so the windows need no copy of their own."""
        rows = x.reshape(-1, x.shape[-1]).index_select(0, self.window_rows)
        return rows.view(self.n_seq, -1, x.shape[-1])

    def own(self, rows: torch.Tensor) -> torch.Tensor:
        """`with_previous` rows -> (s, C, m, E), each chunk's own rows (a view)."""
        return rows[:, -self.padded :].unflatten(1, (self.n_chunks, self.m))

    def windows(self, rows: torch.Tensor) -> torch.Tensor:
        """`with_previous` rows -> (s, C, W*m, E), each chunk's window: the previous chunk then
        its own (W = 1 with a single chunk), as `window_view` lays them out, without its copy."""
        if self.n_chunks == 1:
            return self.own(rows)
        return overlapping_windows(rows, self.n_chunks, self.m)

    def unsort(self, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(s, C, m, E) -> (s, Lp, E) back in position order, into `out` if given."""
        flat = y.reshape(-1, y.shape[-1])  # (s*Lp, E)
        if out is None:
            return flat.index_select(0, self.position_rows).view(self.n_seq, self.padded, -1)
        return torch.index_select(flat, 0, self.position_rows, out=out.view(-1, y.shape[-1]))


def sequence_slices(x: torch.Tensor, m: int, n_chunks: int) -> list[slice]:
    """Slices of the S = B*H sequences of x (S, Lp, D) such that one round of a slice keeps
    every window temporary (score bias, key and value windows, W*max(m, D) elements per row)
    within SLICE_BYTES, and at least one sequence each. (The backward's window gradients are
    further split into ranges of chunks: `chunk_pieces`.)"""
    n_seq, padded, head_dim = x.shape
    window = 1 if n_chunks == 1 else 2
    bytes_per_sequence = padded * window * max(m, head_dim) * x.element_size()
    per_slice = max(1, SLICE_BYTES // bytes_per_sequence)
    return [slice(start, min(start + per_slice, n_seq)) for start in range(0, n_seq, per_slice)]


def _round(mask, part: slice, r: int) -> torch.Tensor | None:
    """Round r of the sequences `part` of a whole mask, or built by a `RoundMasks`."""
    if mask is None:
        return None
    if isinstance(mask, RoundMasks):
        return mask.round(part, r)
    return mask[part, r]


class RoundMasks:
    """The window keys a sorted query must not see, per slice of sequences and round.

    order, slot: (S, R, Lp) as in `LSHAttention.attend`. `fill` writes one round of a group of
    sequences into a (g, C, m, W*m) uint8 mask; `round` builds one. `LSHAttention._hidden_keys`
    fills its whole mask with `fill`; above MASK_BYTES the attention takes this object instead
    and builds each slice and round's part when it attends to it (twice per step: forward and
    backward), so only one slice-round of mask is live.
    """

    def __init__(self, order, slot, length: int, m: int, *, causal: bool, dedup: bool):
        n_seq, self.rounds, padded = order.shape
        self.order, self.length, self.m, self.padded = order, length, m, padded
        self.n_chunks = padded // m
        self.window = 1 if self.n_chunks == 1 else 2
        self.causal, self.dedup = causal, dedup
        # Positions compare against `length` and chunk indices against n_chunks: the dtypes
        # must hold those too (int16 wraps 32768 around to -32768 without an error).
        self.positions = order.to(index_dtype(padded + 1))  # (S, R, Lp)
        self.chunk_of = (slot // m).to(index_dtype(self.n_chunks + 1))  # (S, R, Lp) chunk

    def round(self, part: slice, r: int) -> torch.Tensor:
        """(s, C, m, W*m) uint8 mask of round r of sequences `part`."""
        n_seq = len(range(*part.indices(self.order.shape[0])))
        shape = (n_seq, self.n_chunks, self.m, self.window * self.m)
        mask = torch.empty(shape, dtype=torch.uint8, device=self.order.device)
        self.fill(mask, part, r, torch.empty_like(mask))
        return mask

    def fill(self, mask: torch.Tensor, group: slice, r: int, same: torch.Tensor) -> None:
        """Write round r of sequences `group` into `mask` (g, C, m, W*m); `same` is scratch of
        its shape."""
        n_chunks, m, order = self.n_chunks, self.m, self.order
        pos = self.positions[group, r].unflatten(-1, (n_chunks, m))  # (g, C, m)
        if self.causal:
            # Padded keys sit after every real query, so this also hides them.
            torch.gt(window_keys(pos), pos.unsqueeze(-1), out=mask)
        elif self.length < self.padded:
            torch.ge(window_keys(pos).expand_as(mask), self.length, out=mask)
        else:
            mask.zero_()
        for earlier in range(r if self.dedup else 0):
            # Key j is in query i's window in round e iff chunk_e(i) is chunk_e(j) or the one
            # after it.
            chunk = self.chunk_of[group, earlier].gather(1, order[group, r])  # (g, Lp)
            chunk = chunk.unflatten(-1, (n_chunks, m))  # (g, C, m)
            query_chunk = chunk.unsqueeze(-1)  # (g, C, m, 1)
            mask |= torch.eq(window_keys(chunk), query_chunk, out=same)
            mask |= torch.eq(window_keys((chunk + 1) % n_chunks), query_chunk, out=same)


def window_view(x: torch.Tensor) -> torch.Tensor:
    """Each chunk's keys: (G, C, m, E) -> (G, C, W*m, E), the previous chunk then its own.

    The previous chunk of a row's first is the row's last (wrap-around); with one chunk W = 1.
    A strided view of one copy of x with the last chunk prepended (see `overlapping_windows`).
    """
    n_chunks, m = x.shape[1], x.shape[2]
    if n_chunks == 1:
        return x
    flat = x.flatten(1, 2)  # (G, C*m, E)
    return overlapping_windows(torch.cat([flat[:, -m:], flat], dim=1), n_chunks, m)


def window_keys(x: torch.Tensor) -> torch.Tensor:
    """Per-row values (..., C, m) -> (..., C, 1, W*m), each chunk's window keys' values as
    `window_view` lays them out, ready to compare against the chunk's queries (..., C, m, 1)."""
    lead, (n_chunks, m) = x.shape[:-2], x.shape[-2:]
    windows = window_view(x.reshape(-1, n_chunks, m, 1))  # (G, C, W*m, 1)
    return windows.reshape(*lead, n_chunks, 1, -1)


def overlapping_windows(rows: torch.Tensor, n_chunks: int, m: int) -> torch.Tensor:
    """(G, (C+1)*m, E) rows, the last chunk's first, -> (G, C, 2m, E): window c is rows
    c*m .. c*m + 2m, a strided view, so consecutive windows share memory instead of being
    2m-row copies."""
    groups, _, width = rows.shape
    group_stride, row_stride, col_stride = rows.stride()
    return rows.as_strided(
        (groups, n_chunks, 2 * m, width),
        (group_stride, m * row_stride, row_stride, col_stride),
        rows.storage_offset(),
    )


class WindowGradient:
    """The gradient of rows (G, C, m, D) from the gradients of their windows, added one range of
    chunks at a time: the gradient of `window_view`, for window gradients that come in pieces.

    Chunk c's rows are the own half of window c and the previous half of window c + 1 (window
    0's previous half is the last chunk's). Ranges must come in order and cover 0 .. C once.
    """

    def __init__(self, like: torch.Tensor):
        self.grad = torch.empty_like(like)  # (G, C, m, D)
        self.n_chunks = like.shape[1]
        self.wrapped = None  # window 0's previous half, for the last chunk, which comes last

    def add(self, grad_windows: torch.Tensor, chunks: slice) -> None:
        """grad_windows: (G, c, W*m, D), the windows of `chunks` (a range start:stop)."""
        start, stop = chunks.start, chunks.stop
        if self.n_chunks == 1:
            self.grad.copy_(grad_windows)
            return
        previous, own = grad_windows.chunk(2, dim=2)  # (G, c, m, D) each; previous[:, i] is i-1's
        torch.add(own[:, :-1], previous[:, 1:], out=self.grad[:, start : stop - 1])
        self.grad[:, stop - 1].copy_(own[:, -1])
        if start == 0:
            self.wrapped = previous[:, 0].clone()  # not a view: the piece can go
        else:
            self.grad[:, start - 1] += previous[:, 0]

    def result(self) -> torch.Tensor:
        if self.wrapped is not None:
            self.grad[:, -1] += self.wrapped
            self.wrapped = None
        return self.grad


def chunk_pieces(query_shape, window: int, element_size: int) -> list[slice]:
    """Ranges of the chunks of queries (s, C, m, D) whose window gradients (s, c, window, D)
    stay within PIECE_BYTES (one chunk at least), for one flash backward call each."""
    n_seq, n_chunks, _, head_dim = query_shape
    per_piece = max(1, PIECE_BYTES // (n_seq * window * head_dim * element_size))
    return [slice(c, min(c + per_piece, n_chunks)) for c in range(0, n_chunks, per_piece)]


class ScratchBuffer:
    """One buffer reused for the score bias of every round and range of chunks, viewed at the
    shape each asks for and grown to the largest: a new bias, 16 MiB per 32K sequence, came
    back as fresh pages on every round, and faulting them in cost as much as writing it."""

    def __init__(self, like: torch.Tensor):
        self.like = like  # dtype and device
        self.data: torch.Tensor | None = None

    def view(self, shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        if self.data is None or self.data.numel() < numel:
            self.data = self.like.new_empty(numel)
        return self.data[:numel].view(shape)


def window_bias(
    hidden: torch.Tensor | None, norm: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    """Additive score bias laid out as `window_view`'s keys, written into `out` (G, c, m, W*m),
    a float tensor of norm's dtype.

    flash.masked_score where `hidden` ((G, c, m or 1, W*m), uint8) hides a key; on a token's
    score for itself -(2 |q| + SELF_MARGIN), which puts it SELF_MARGIN below the lowest score
    any other key can have (|q . k_hat| <= |q|): a token attends to itself only when it has no
    other key, with no precision lost to a huge constant. norm: (G, c, m, 1), the queries' |q|.
    """
    m = out.shape[2]
    bias = out.zero_() if hidden is None else flash.hidden_bias(hidden, out.dtype, out=out)
    own = bias[..., -m:]  # (G, C, m, m) view: the own chunk is the window's last
    own.diagonal(dim1=-2, dim2=-1).copy_(norm.squeeze(-1).mul(-2).sub_(SELF_MARGIN))
    return bias
