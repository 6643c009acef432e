"""Reformer's LSH attention: shared-QK keys hashed into angular buckets, sorted and chunked.

Each of `n_hashes` rounds hashes every position into one of `n_buckets` buckets, sorts the
positions by (bucket, position), cuts the sorted sequence into chunks of m = `bucket_size` and
lets every chunk attend to itself and to the previous chunk of its round (the first chunk wraps
around to the round's last). The rounds are then combined with their logsumexp weights,
o = sum_r exp(lse_r - logsumexp_r lse_r) o_r. A query scores at most 2m keys per round, so time
and memory are linear in L.

Choices where published implementations differ:
- Keys are the unit-normalised queries (shared QK) and scores are q . k_hat / sqrt(d), as in the
  paper; there is no further 1/sqrt(d) on the unit keys.
- Hash: one random rotation R of shape (d, n_hashes, n_buckets/2) per forward, shared by every
  batch row and head (the vectors are still hashed independently; only the projection is
  shared), bucket = argmax([xR; -xR]). Fresh from the global RNG each call, or the same every
  call when `seed` is set. `n_buckets` defaults to the paper's 2 L/m, about two buckets per chunk.
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

Hashing (no gradient) costs n_hashes * L * d * n_buckets multiply-adds, O(n_hashes L^2 d / m)
with the default bucket count: it equals the attention's own forward matmuls at L = 4 m^2 (16K
for m = 64) and grows past them beyond. `flops` counts only the attention matmuls.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.autograd.function import once_differentiable

from variants.attention.base import Attention, is_replaying, pad_to_multiple
from variants.checks import require_non_negative_int, require_positive_int
from variants.registry import register_attention

# A token's score for itself. Finite, unlike a masked score (-inf), so a row whose other keys are
# all masked falls back to the token itself, and exp(-1e5) is 0 next to any real score.
SELF_SCORE = -1e5
# Keys are q / max(|q|, NORM_EPS), as F.normalize: padded (zero) queries give zero keys.
NORM_EPS = 1e-12


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
        if not isinstance(dedup, bool):
            raise ValueError(f"{self.name}: option 'dedup' must be true or false, got {dedup!r}")
        self.dedup = dedup
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

        # Rounds are folded into the batch: row g = (b, h, r) holds one round's sorted sequence.
        # source_rows: for every sorted slot, its row in the flattened (B*H*Lp, D) inputs.
        head_offset = torch.arange(batch * heads, device=q.device).view(batch, heads, 1, 1)
        source_rows = (order + head_offset * padded).view(-1)  # (G*Lp,), G = B*H*R
        sorted_q, sorted_v = (
            x.reshape(-1, head_dim).index_select(0, source_rows).view(-1, n_chunks, m, head_dim)
            for x in (q, v)
        )  # (G, C, m, D) each
        hidden = self._hidden_keys(order, source_rows, length)  # (W, G, C, m or 1, m) or None
        out, lse = SharedQKWindowAttention.apply(sorted_q, sorted_v, hidden)  # (G,C,m,D), (G,C,m)

        # Round weights exp(lse_r - logsumexp_r lse_r): the rounds of a position meet in
        # position order, and the weights go back to each round's sorted order.
        lse = lse.view(batch, heads, rounds, padded)  # (B, H, R, Lp) sorted
        lse_by_position = torch.zeros_like(lse).scatter(-1, order, lse)  # (B, H, R, Lp)
        # A softmax, not exp(lse - logsumexp): self-only rows have lse near -1e5, where float32
        # cannot hold the difference.
        weights = lse_by_position.softmax(dim=2).gather(-1, order)  # (B, H, R, Lp) sorted
        # Un-sort and add up the rounds in one scatter: each position receives R weighted rows.
        weighted = out.view(-1, head_dim) * weights.view(-1, 1)  # (G*Lp, D)
        out = weighted.new_zeros(batch * heads * padded, head_dim)
        out = out.index_add(0, source_rows, weighted).view(batch, heads, padded, head_dim)
        return out[:, :, :length]

    def _buckets(self, q: torch.Tensor, length: int) -> torch.Tensor:
        """Bucket of every position in every round, (B, H, R, Lp) int64; cached for replays.

        q: (B, H, Lp, D), zero-padded after `length`. Padded positions get bucket n_buckets.
        """
        batch, heads, padded, head_dim = q.shape
        n_buckets = self.n_buckets or 2 * padded // self.bucket_size
        # Drawn even when replaying: the recompute restores the RNG state of the forward, and
        # the dropout after this kernel must draw the same mask, so the draws must match too.
        rotations = self._rotations(head_dim, n_buckets // 2, q)  # (D, R, nb/2)
        cached = self.last_buckets
        replayable = cached is not None and cached.shape == (batch, heads, self.n_hashes, padded)
        if is_replaying() and replayable:
            return cached
        buckets = angular_hash(q.detach(), rotations)  # (B, H, R, Lp)
        buckets[..., length:] = n_buckets
        self.last_buckets = buckets
        return buckets

    def _rotations(self, head_dim: int, half: int, like: torch.Tensor) -> torch.Tensor:
        """Random rotation (D, n_hashes, half) on `like`'s device and dtype; seeded if `seed`."""
        shape = (head_dim, self.n_hashes, half)
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


def angular_hash(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: bucket = argmax([xR; -xR]) per round.

    x: (B, H, L, D); rotations: (D, R, nb/2). Returns (B, H, R, L) int64 buckets in [0, nb).
    The largest of [xR; -xR] is the entry of xR largest in absolute value, taken in the second
    half when negative; max and min find it without materialising [xR; -xR] or |xR|. Rounds go
    one at a time through one (L, nb/2) buffer because the default bucket count grows with L:
    that buffer, L^2/m per head, is as large as all rounds' scores at L = 2 n_hashes m^2 (32K
    for the defaults) and larger beyond.
    """
    half = rotations.shape[-1]
    buckets = []
    with torch.no_grad():
        projected = x.new_empty(*x.shape[:-1], half)  # (B, H, L, nb/2)
        for rotation in rotations.unbind(dim=1):  # (D, nb/2) each
            torch.matmul(x, rotation, out=projected)
            top, top_index = projected.max(dim=-1)  # (B, H, L)
            bottom, bottom_index = projected.min(dim=-1)  # (B, H, L)
            buckets.append(torch.where(top >= -bottom, top_index, bottom_index + half))
    return torch.stack(buckets, dim=2)  # (B, H, R, L)


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

    Keys are the unit-normalised queries and scores q . k_hat / sqrt(d); a token's score for
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
        inv_norm = q.norm(dim=-1, keepdim=True).clamp_min_(NORM_EPS).reciprocal_()  # (G,C,m,1)
        keys, values = window_halves(q * inv_norm), window_halves(v)  # W x (G, C, m, D)
        queries = q * q.shape[-1] ** -0.5
        probs = q.new_empty((len(keys), *q.shape[:-1], q.shape[-2]))  # (W, G, C, m, m) scores
        for half, key in enumerate(keys):
            torch.matmul(queries, key.transpose(-1, -2), out=probs[half])
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
        scale = q.shape[-1] ** -0.5
        unit = q * inv_norm  # (G, C, m, D)
        keys, values = window_halves(unit), window_halves(v)  # W x (G, C, m, D)
        # d score_ij = p_ij (d p_ij - sum_k p_ik d p_ik + d lse_i), where sum_k p_ik d p_ik is
        # d out_i . out_i.
        row_term = (grad_out * out).sum(dim=-1, keepdim=True) - grad_lse.unsqueeze(-1)
        grad_scores = torch.empty_like(probs)  # (W, G, C, m, m)
        for half, value in enumerate(values):
            torch.matmul(grad_out, value.transpose(-1, -2), out=grad_scores[half])
        grad_scores.sub_(row_term).mul_(probs)
        grad_scores[0].diagonal(dim1=-2, dim2=-1).zero_()  # the self score is a constant
        grad_v = unwindow([p.transpose(-1, -2) @ grad_out for p in probs])  # (G, C, m, D)
        # q has two roles, both under the 1/sqrt(d) scale: query, and key through unit = q / |q|,
        # whose gradient loses its radial part and is divided by |q|.
        grad_q = matmul_sum(grad_scores, keys)  # (G, C, m, D), query role / scale
        grad_unit = unwindow([g.transpose(-1, -2) @ q for g in grad_scores])  # (G, C, m, D) / scale
        radial = (grad_unit * unit).sum(dim=-1, keepdim=True)  # (G, C, m, 1)
        grad_q.addcmul_(grad_unit.sub_(unit * radial), inv_norm)
        return grad_q.mul_(scale), grad_v, None
