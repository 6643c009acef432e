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
- Self: a token's score for itself is -1e5 (finite, as in the paper), so it attends to itself
  only when it has no other key.
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

A length that is not a multiple of m is padded; padded positions hash into an extra last bucket
(so they sort to the end of every round), are never keys, and their outputs are dropped.

Hashing (no gradient) costs n_hashes * L * d * (sum of the factors' bucket counts / 2)
multiply-adds: below the attention's own matmuls at every length. `flops` counts only the
attention matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.autograd.function import once_differentiable

from variants.attention.base import (
    SHARED_QK_NORM_EPS,
    Attention,
    is_replaying,
    pad_to_multiple,
)
from variants.checks import require_bool, require_non_negative_int, require_positive_int
from variants.registry import register_attention

# A token's score for itself. Finite, unlike a masked score (-inf), so a row whose other keys are
# all masked falls back to the token itself, and exp(-1e5) is 0 next to any real score.
SELF_SCORE = -1e5
# Up to this many buckets the hash is one angular hash, as in the paper; beyond, see hash_factors.
SINGLE_HASH_MAX_BUCKETS = 128


@register_attention
class LSHAttention(Attention):
    """Reformer LSH attention: shared-QK angular hashing, chunks of sorted buckets, n rounds.

    The `k` argument is ignored: keys are the unit-normalised queries. The model passes
    shared-QK projections (q = k) because this variant declares `shared_qk_required`.
    The buckets of the last forward are kept in `last_buckets`, (batch, heads, n_hashes,
    padded seq_len); inside `base.replaying()` a forward reuses them instead of hashing anew,
    so that a reversible or checkpointed recompute sees the same buckets.
    """

    name = "lsh"
    exact = False
    time_complexity = "O(n_hashes L m d)"
    memory_complexity = "O(n_hashes L m)"
    shared_qk_required = True

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
        m, rounds = self.bucket_size, self.n_hashes
        q = pad_to_multiple(q, m)  # (B, H, Lp, D)
        v = pad_to_multiple(v, m)  # (B, H, Lp, D)
        padded = q.shape[2]
        n_chunks = padded // m

        buckets = self._buckets(q, length)  # (B, H, R, Lp)
        # Buckets are < n_buckets + 1 and positions < Lp, so this key orders by bucket and then
        # by position with a single argsort (its keys are unique, so stability is moot).
        positions = torch.arange(padded, device=q.device)
        order = (buckets * padded + positions).argsort(dim=-1)  # (B, H, R, Lp) position per slot
        slot = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))  # (B,H,R,Lp)

        # Rounds are folded into the batch: row g = (b, h, r) holds one round's sorted sequence.
        # Three row layouts: inputs (B*H*Lp), sorted (G*Lp, G = B*H*R) and by position with the
        # rounds apart (G*Lp). source_rows: input row of each sorted slot; sorted_rows and
        # position_rows: the two directions between the sorted and by-position layouts.
        group = torch.arange(batch * heads * rounds, device=q.device).view(batch, heads, rounds, 1)
        group_start = group * padded  # (B, H, R, 1) first row of each round's sequence
        source_rows = (order + group // rounds * padded).view(-1)  # (G*Lp,)
        sorted_rows = (slot + group_start).view(-1, rounds, padded)  # (B*H, R, Lp)
        position_rows = (order + group_start).view(-1, 1, padded)  # (G, 1, Lp)
        sorted_q, sorted_v = (
            GatherRows.apply(x.reshape(-1, head_dim), source_rows, sorted_rows).view(
                -1, n_chunks, m, head_dim
            )
            for x in (q, v)
        )  # (G, C, m, D) each
        hidden = self._hidden_keys(order, source_rows, length)  # (W, G, C, m or 1, m) or None
        out, lse = SharedQKWindowAttention.apply(sorted_q, sorted_v, hidden)  # (G,C,m,D), (G,C,m)

        # Back to position order, every round apart, then the rounds combined with the weights
        # exp(lse_r - logsumexp_r lse_r). A softmax, not exp(lse - logsumexp): self-only rows
        # have lse near -1e5, where float32 cannot hold the difference.
        unsort = sorted_rows.view(-1)  # (G*Lp,) sorted row of each (round, position)
        out = GatherRows.apply(out.view(-1, head_dim), unsort, position_rows)  # (G*Lp, D)
        lse = GatherRows.apply(lse.view(-1, 1), unsort, position_rows)  # (G*Lp, 1)
        weights = lse.view(batch, heads, rounds, padded, 1).softmax(dim=2)  # (B, H, R, Lp, 1)
        out = (out.view(batch, heads, rounds, padded, head_dim) * weights).sum(dim=2)
        return out[:, :, :length]  # (B, H, L, D)

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
            return cached
        buckets = angular_hash(q.detach(), rotations, factors)  # (B, H, R, Lp)
        # Monotone onto exactly n_buckets: neighbouring product buckets merge when the factors'
        # product overshoots, which keeps similar vectors adjacent in the sort.
        buckets = buckets * n_buckets // math.prod(factors)
        buckets[..., length:] = n_buckets
        self.last_buckets = buckets
        return buckets

    def _rotations(self, head_dim: int, columns: int, like: torch.Tensor) -> torch.Tensor:
        """Random rotation (D, n_hashes, columns) on `like`'s device and dtype; seeded if `seed`."""
        shape = (head_dim, self.n_hashes, columns)
        if self.seed is None:
            return torch.randn(shape, device=like.device, dtype=like.dtype)
        generator = torch.Generator(device=like.device).manual_seed(self.seed)
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)

    def _hidden_keys(
        self, order: torch.Tensor, source_rows: torch.Tensor, length: int
    ) -> torch.Tensor | None:
        """Bool mask of the window keys each sorted query must not see, or None.

        order: (B, H, R, Lp) position at each sorted slot; source_rows as in `attend`. Hides
        later keys (causal) or padded keys, and with `dedup` pairs an earlier round already
        offers. Shape (W, G, C, m, m), or (W, G, C, 1, m) when only padding is hidden, laid out
        as the scores of `SharedQKWindowAttention`.
        """
        padded = order.shape[-1]
        n_chunks = padded // self.bucket_size
        pos = order.view(-1, n_chunks, self.bucket_size).to(torch.int32)  # (G, C, m)
        key_pos = window(pos).unsqueeze(-2)  # (W, G, C, 1, m)
        hidden = None
        if self.causal:
            # Padded keys sit after every real query, so the causal mask also hides them.
            hidden = key_pos > pos.unsqueeze(-1)  # (W, G, C, m, m)
        elif length < padded:
            hidden = key_pos >= length  # (W, G, C, 1, m)
        # With one or two chunks every window is the whole sequence in every round: every pair
        # counts n_hashes times, which cancels in the softmax and in the round weights.
        if self.dedup and self.n_hashes > 1 and n_chunks > 2:
            seen = seen_in_earlier_round(order, source_rows, self.bucket_size)
            hidden = seen if hidden is None else seen.logical_or_(hidden)
        return hidden

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


class GatherRows(torch.autograd.Function):
    """rows = x[index] along dim 0, with a backward that gathers too instead of scattering.

    x: (N, D); index: (M,) rows of x. `inverse`: (N', copies, n) int64 with N' * n = N, the rows
    of the output that each row of x went to, grouped so that summing over `copies` gives the
    gradient of x: (g, c, i) holds the c-th copy of x's row g * n + i. With copies = 1 this is
    the inverse permutation. PyTorch's own backward of index_select is an index_add (and that of
    gather a scatter_add): on CPU those four scatters took 15 % of LSH's forward+backward at 4K,
    far more than gathers of the same rows.
    """

    @staticmethod
    def forward(ctx, x, index, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(0, index)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_rows):
        (inverse,) = ctx.saved_tensors
        grad = grad_rows.index_select(0, inverse.view(-1)).view(*inverse.shape, -1)  # (N',c,n,D)
        grad = grad.squeeze(1) if inverse.shape[1] == 1 else grad.sum(dim=1)  # (N', n, D)
        return grad.flatten(0, 1), None, None


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
    entry of xR largest in absolute value, taken in the second half when negative; max and min
    find it without materialising [xR; -xR] or |xR|. All rounds project in one matmul: the
    columns per round are at most SINGLE_HASH_MAX_BUCKETS / 2 or about sqrt(n_buckets).
    """
    with torch.no_grad():
        projected = torch.matmul(x, rotations.flatten(1))  # (B, H, L, R * columns)
        projected = projected.unflatten(-1, (rotations.shape[1], -1))  # (B, H, L, R, columns)
        buckets = torch.zeros(projected.shape[:-1], dtype=torch.int64, device=x.device)
        parts = projected.split([n // 2 for n in factors], dim=-1)  # (B, H, L, R, n_f/2) each
        for part, n in zip(parts, factors, strict=True):
            top, top_index = part.max(dim=-1)  # (B, H, L, R)
            bottom, bottom_index = part.min(dim=-1)  # (B, H, L, R)
            bucket = torch.where(top >= -bottom, top_index, bottom_index + n // 2)  # (B, H, L, R)
            buckets = buckets * n + bucket
    return buckets.transpose(-1, -2).contiguous()  # (B, H, R, L)


def window(x: torch.Tensor) -> torch.Tensor:
    """Each chunk's window: (G, C, m, ...) -> (W, G, C, m, ...), its own chunk then the previous.

    The previous chunk of a row's first is the row's last (wrap-around). With a single chunk
    W = 1, so that no key enters a window twice. For index tensors; the attention itself uses
    `window_halves` and never copies keys or values into windows.
    """
    return torch.stack(window_halves(x))


def window_halves(x: torch.Tensor) -> list[torch.Tensor]:
    """[x, x with every chunk replaced by the previous one], or [x] if there is one chunk."""
    return [x] if x.shape[1] == 1 else [x, x.roll(1, dims=1)]


def unwindow(halves: list[torch.Tensor]) -> torch.Tensor:
    """Gradient of `window_halves`: add each previous-chunk half back onto its own chunk.

    Accumulates into `halves[0]` in place (two shifted adds instead of a rolled copy).
    """
    if len(halves) == 1:
        return halves[0]
    own, previous = halves  # (G, C, m, ...) each; previous[:, c] belongs to chunk c - 1
    own[:, :-1] += previous[:, 1:]
    own[:, -1] += previous[:, 0]
    return own


def matmul_sum(lefts: Iterable[torch.Tensor], rights: Iterable[torch.Tensor]) -> torch.Tensor:
    """sum_i lefts[i] @ rights[i] over (G, C, x, y) @ (G, C, y, z), accumulated in one buffer."""
    (first_left, first_right), *rest = zip(lefts, rights, strict=True)
    total = first_left @ first_right  # (G, C, x, z)
    flat = total.view(-1, *total.shape[-2:])  # (G*C, x, z)
    for left, right in rest:
        flat.baddbmm_(left.flatten(0, 1), right.flatten(0, 1))
    return total


def chunk_dtype(n_chunks: int) -> torch.dtype:
    """The narrowest integer type for chunk indices: the pairwise comparisons run on it."""
    return torch.int16 if n_chunks <= torch.iinfo(torch.int16).max else torch.int32


def seen_in_earlier_round(order: torch.Tensor, source_rows: torch.Tensor, m: int) -> torch.Tensor:
    """Window pairs that an earlier round's windows already hold.

    order: (B, H, R, Lp) position at each sorted slot; source_rows: (B*H*R*Lp,) the row of each
    slot's position in the flattened (B*H*Lp) positions. Returns (2, G, C, m, m) bool, True
    where key j of query i's window is also in i's window in a round before this one. Masking
    those counts every pair in the first round that offers it and in no other.
    Key j is in query i's window in round r iff chunk_r(i) is chunk_r(j) or the one after it.
    """
    batch, heads, rounds, padded = order.shape
    n_chunks = padded // m
    positions = torch.arange(padded, device=order.device).expand_as(order)
    slot = torch.empty_like(order).scatter_(-1, order, positions)  # (B, H, R, Lp)
    chunk_of = (slot // m).to(chunk_dtype(n_chunks)).transpose(-1, -2)  # (B, H, Lp, R)
    query_chunks = chunk_of.reshape(-1, rounds).index_select(0, source_rows)  # (G*Lp, R)
    query_chunks = query_chunks.view(-1, n_chunks, m, rounds)  # (G, C, m, R)
    key_chunks = window(query_chunks).unsqueeze(-3)  # (2, G, C, 1, m, R)
    next_chunks = (key_chunks + 1) % n_chunks  # (2, G, C, 1, m, R)

    # Row g = (b, h, r): view the rows as (B*H, R) to pick the rounds after `earlier`.
    by_round = (batch * heads, rounds, n_chunks)
    query_chunks = query_chunks.view(*by_round, m, 1, rounds)  # (BH, R, C, m, 1, R)
    key_chunks = key_chunks.view(2, *by_round, 1, m, rounds)  # (2, BH, R, C, 1, m, R)
    next_chunks = next_chunks.view(2, *by_round, 1, m, rounds)  # (2, BH, R, C, 1, m, R)
    seen = torch.zeros(2, *by_round, m, m, dtype=torch.bool, device=order.device)
    # One earlier round at a time, against all the rounds after it: comparing every pair of
    # rounds at once would hold R times the mask, and half of those comparisons are not needed.
    for earlier in range(rounds - 1):
        later = slice(earlier + 1, None)
        query_chunk = query_chunks[:, later, ..., earlier]  # (BH, R', C, m, 1)
        seen_later = seen[:, :, later]  # (2, BH, R', C, m, m) view
        seen_later |= key_chunks[:, :, later, ..., earlier] == query_chunk
        seen_later |= next_chunks[:, :, later, ..., earlier] == query_chunk
    return seen.view(2, -1, n_chunks, m, m)


class SharedQKWindowAttention(torch.autograd.Function):
    """Shared-QK softmax attention of every chunk over its window: itself and the previous chunk.

    Keys are the unit-normalised queries and scores q . k_hat; a token's score for
    itself is SELF_SCORE. Scores are held as (W, G, C, m, m), one (m, m) block per window half
    (own chunk, previous chunk; W = 1 with a single chunk), so keys and values are never copied
    into 2m-row windows. Hand-written so that the scores live in one buffer, become
    probabilities in place and are saved as they are: autograd would keep scores, exponentials
    and probabilities apart, and every fresh buffer of that size costs page faults on top of
    its passes.
    """

    @staticmethod
    def forward(ctx, q, v, hidden):
        """q, v: (G, C, m, D) sorted chunks; hidden: bool broadcastable to (W, G, C, m, m),
        True for keys a query must not see, or None.
        Returns out (G, C, m, D) and each row's logsumexp (G, C, m)."""
        inv_norm = q.norm(dim=-1, keepdim=True).clamp_min_(SHARED_QK_NORM_EPS).reciprocal_()
        # inv_norm: (G, C, m, 1)
        keys, values = window_halves(q * inv_norm), window_halves(v)  # W x (G, C, m, D)
        probs = q.new_empty((len(keys), *q.shape[:-1], q.shape[-2]))  # (W, G, C, m, m) scores
        for half, key in enumerate(keys):
            torch.matmul(q, key.transpose(-1, -2), out=probs[half])
        if hidden is not None:
            probs.masked_fill_(hidden, float("-inf"))
        # The own chunk's keys are the queries in order, so self is the diagonal; set last, it
        # leaves every row one finite score.
        probs[0].diagonal(dim1=-2, dim2=-1).fill_(SELF_SCORE)
        top = probs.amax(dim=(0, -1), keepdim=True)  # (1, G, C, m, 1)
        probs.sub_(top).exp_()
        total = probs.sum(dim=(0, -1), keepdim=True)  # (1, G, C, m, 1)
        probs.div_(total)  # now probabilities
        out = matmul_sum(probs, values)  # (G, C, m, D)
        lse = (top + total.log()).view(q.shape[:-1])  # (G, C, m)
        ctx.save_for_backward(q, v, inv_norm, probs, out)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):
        q, v, inv_norm, probs, out = ctx.saved_tensors
        unit = q * inv_norm  # (G, C, m, D)
        keys, values = window_halves(unit), window_halves(v)  # W x (G, C, m, D)
        # d score_ij = p_ij (d p_ij - sum_k p_ik d p_ik + d lse_i), where sum_k p_ik d p_ik is
        # d out_i . out_i.
        row_term = (grad_out * out).sum(dim=-1, keepdim=True) - grad_lse.unsqueeze(-1)
        grad_v = unwindow([p.transpose(-1, -2) @ grad_out for p in probs])  # (G, C, m, D)
        # q has two roles: query, and key through unit = q / |q|,
        # whose gradient loses its radial part and is divided by |q|. One window half at a time:
        # a whole (W, G, C, m, m) score gradient would be the largest buffer of the backward
        # (0.5 GB per layer at 64K tokens), and each half is used up at once.
        grad_q = torch.zeros_like(q)  # (G, C, m, D), query role
        grad_unit_halves = []  # W x (G, C, m, D), key role
        for half, (key, value) in enumerate(zip(keys, values, strict=True)):
            grad_scores = (grad_out @ value.transpose(-1, -2)).sub_(row_term).mul_(probs[half])
            if half == 0:  # the self score is a constant
                grad_scores.diagonal(dim1=-2, dim2=-1).zero_()
            grad_q.view(-1, *q.shape[-2:]).baddbmm_(grad_scores.flatten(0, 1), key.flatten(0, 1))
            grad_unit_halves.append(grad_scores.transpose(-1, -2) @ q)
        grad_unit = unwindow(grad_unit_halves)  # (G, C, m, D)
        radial = (grad_unit * unit).sum(dim=-1, keepdim=True)  # (G, C, m, 1)
        grad_q.addcmul_(grad_unit.sub_(unit * radial), inv_norm)
        return grad_q, grad_v, None
