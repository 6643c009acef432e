"""Fixed attention patterns as predicates on (query index, key index), and their block form.

A pattern says which key positions j a query position i may attend to: a small predicate,
`allows(i, j)`, on broadcastable integer tensors of positions; `a | b` is a union, `a & b` an
intersection, `~a` the complement. The one predicate is a pattern's single source of meaning:
the kernels' element masks, FlexAttention's block masks, the FLOP counts and the pictures all
evaluate it. Its block form, `tile_states`, says for every (query tile, key tile) whether no
pair is allowed (EMPTY), every pair is (FULL) or some are (PARTIAL), from the tiles' position
ranges in O((L / tile)^2), never from an (L, L) mask.

The vocabulary: Everything, Causal, Local(block, back, forward), Band(width), Strided(stride),
Global(n, causal), Random.draw(...), Summary(block, width). Each one's rule and the block form
in full: docs/variants/combined.md, "The pattern vocabulary".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

# Tile states, ordered so that a union is an element-wise max and an intersection a min.
EMPTY, PARTIAL, FULL = 0, 1, 2
# Partial tiles evaluated per batch when counting pairs: bounds the temporaries to ~16M entries.
_COUNT_ENTRIES = 1 << 24


class Pattern:
    """A set of allowed (query, key) position pairs: a predicate plus its block form."""

    def allows(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Bool tensor, True where query position `query` may attend key position `key`.

        query, key: integer tensors of positions in [0, seq_len), broadcast against each other
        (e.g. (L, 1) and (1, L) give the (L, L) mask). Uses only element-wise tensor operations,
        so it also serves as FlexAttention's `mask_mod`.
        """
        raise NotImplementedError

    def range_states(
        self,
        q_first: torch.Tensor,
        q_last: torch.Tensor,
        k_first: torch.Tensor,
        k_last: torch.Tensor,
    ) -> torch.Tensor:
        """Tile states (uint8 EMPTY/PARTIAL/FULL) of query positions [q_first, q_last] against
        key positions [k_first, k_last] (inclusive ranges, broadcastable int64 tensors)."""
        raise NotImplementedError

    def shift_invariant(self, period: int) -> bool:
        """True if allows(i + period, j + period) == allows(i, j) for all i, j: then one
        block's mask serves every block of `period` (`local.window_mask` uses this)."""
        return False

    # --- derived forms ------------------------------------------------------------------------
    def tile_states(self, seq_len: int, tile: int) -> torch.Tensor:
        """Block form: (n, n) uint8 of EMPTY/PARTIAL/FULL per (query tile, key tile), n =
        ceil(seq_len / tile); the last tile holds only the real positions."""
        first = torch.arange(0, seq_len, tile, dtype=torch.int64)  # (n,)
        last = (first + tile - 1).clamp(max=seq_len - 1)  # (n,)
        states = self.range_states(first[:, None], last[:, None], first[None, :], last[None, :])
        return states.expand(len(first), len(first)).contiguous()  # (n, n)

    def dense(self, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
        """(seq_len, seq_len) bool mask. For pictures and small checks only: O(L^2)."""
        position = torch.arange(seq_len, device=device)
        return self.allows(position[:, None], position[None, :])

    def mask_mod(self):
        """The predicate in FlexAttention's form: (batch, head, q_idx, kv_idx) -> bool."""

        def mask_mod(batch, head, q_idx, kv_idx):
            return self.allows(q_idx, kv_idx)

        return mask_mod

    def pairs(self, seq_len: int, tile: int) -> int:
        """The number of allowed pairs: FULL tiles by their area, the predicate evaluated inside
        PARTIAL tiles only (so its cost follows the block form, O(L^2) only if it is dense)."""
        states = self.tile_states(seq_len, tile)
        first = torch.arange(0, seq_len, tile, dtype=torch.int64)
        size = (first + tile).clamp(max=seq_len) - first  # (n,) real positions per tile
        full = states == FULL
        total = int((size[:, None] * size[None, :])[full].sum())
        rows, cols = (states == PARTIAL).nonzero(as_tuple=True)  # (P,) each
        offset = torch.arange(tile, dtype=torch.int64)
        for start in range(0, len(rows), max(1, _COUNT_ENTRIES // tile**2)):
            r = rows[start : start + _COUNT_ENTRIES // tile**2]
            c = cols[start : start + _COUNT_ENTRIES // tile**2]
            query = (first[r, None] + offset)[:, :, None]  # (p, tile, 1)
            key = (first[c, None] + offset)[:, None, :]  # (p, 1, tile)
            real = (query < seq_len) & (key < seq_len)
            last = seq_len - 1  # padding evaluated at a real position, then dropped
            total += int((self.allows(query.clamp(max=last), key.clamp(max=last)) & real).sum())
        return total

    # --- algebra ------------------------------------------------------------------------------
    def __or__(self, other: Pattern) -> Pattern:
        return Union((self, other))

    def __and__(self, other: Pattern) -> Pattern:
        return Intersection((self, other))

    def __invert__(self) -> Pattern:
        return Complement(self)


def _states(full: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """uint8 states from bool FULL and EMPTY conditions (PARTIAL where neither holds)."""
    full, empty = torch.broadcast_tensors(full, empty)
    states = torch.full(full.shape, PARTIAL, dtype=torch.uint8)
    states[full] = FULL
    states[empty] = EMPTY
    return states


@dataclass(frozen=True)
class Everything(Pattern):
    """Every pair: exact attention."""

    def allows(self, query, key):
        return torch.ones_like(query - key, dtype=torch.bool)

    def range_states(self, q_first, q_last, k_first, k_last):
        return _states(torch.tensor(True), torch.tensor(False))

    def shift_invariant(self, period):
        return True


@dataclass(frozen=True)
class Causal(Pattern):
    """j <= i: no query sees a later key."""

    def allows(self, query, key):
        return key <= query

    def range_states(self, q_first, q_last, k_first, k_last):
        return _states(k_last <= q_first, k_first > q_last)

    def shift_invariant(self, period):
        return True


@dataclass(frozen=True)
class Local(Pattern):
    """Block-local: j's block is i's block, one of `look_backward` earlier blocks or one of
    `look_forward` later ones (blocks of `block_size` from position 0, no wrap-around)."""

    block_size: int
    look_backward: int
    look_forward: int

    def allows(self, query, key):
        ahead = key // self.block_size - query // self.block_size  # blocks from i's to j's
        return (ahead >= -self.look_backward) & (ahead <= self.look_forward)

    def range_states(self, q_first, q_last, k_first, k_last):
        # Block differences over a rectangle of positions take every value in [low, high].
        b = self.block_size
        low = k_first // b - q_last // b
        high = k_last // b - q_first // b
        inside = (low >= -self.look_backward) & (high <= self.look_forward)
        outside = (high < -self.look_backward) | (low > self.look_forward)
        return _states(inside, outside)

    def shift_invariant(self, period):
        return period % self.block_size == 0


@dataclass(frozen=True)
class Band(Pattern):
    """|i - j| < width: a sliding window of the `width` nearest positions on each side."""

    width: int

    def allows(self, query, key):
        return (query - key).abs() < self.width

    def range_states(self, q_first, q_last, k_first, k_last):
        low, high = q_first - k_last, q_last - k_first  # i - j over the tile
        nearest = torch.where((low <= 0) & (high >= 0), 0, torch.minimum(low.abs(), high.abs()))
        farthest = torch.maximum(low.abs(), high.abs())
        return _states(farthest < self.width, nearest >= self.width)

    def shift_invariant(self, period):
        return True


@dataclass(frozen=True)
class Strided(Pattern):
    """(i - j) mod stride == 0: every stride-th position, before and after the query."""

    stride: int

    def allows(self, query, key):
        return (query - key) % self.stride == 0

    def range_states(self, q_first, q_last, k_first, k_last):
        low, high = q_first - k_last, q_last - k_first  # every i - j in [low, high] occurs
        hit = torch.div(high, self.stride, rounding_mode="floor") * self.stride >= low
        full = torch.tensor(self.stride == 1) | ((low == high) & hit)
        return _states(full, ~hit)

    def shift_invariant(self, period):
        return True


@dataclass(frozen=True)
class Global(Pattern):
    """The first `n_global` positions: every query sees them and, unless `causal`, they see
    every key (Longformer's global tokens, BigBird's global block)."""

    n_global: int
    causal: bool

    def allows(self, query, key):
        if self.causal:  # `query >= 0` only gives the result the pair's shape
            return (key < self.n_global) & (query >= 0)
        return (key < self.n_global) | (query < self.n_global)

    def range_states(self, q_first, q_last, k_first, k_last):
        full, empty = k_last < self.n_global, k_first >= self.n_global
        if not self.causal:
            full = full | (q_last < self.n_global)
            empty = empty & (q_first >= self.n_global)
        return _states(full, empty)


@dataclass(frozen=True)
class Summary(Pattern):
    """The last `width` positions of every block of `block_size`: summary columns that every
    query sees (the Sparse Transformer's "fixed" pattern A(2), before the causal cut)."""

    block_size: int
    width: int

    def allows(self, query, key):
        # `query >= 0` only gives the result the pair's shape.
        return (key % self.block_size >= self.block_size - self.width) & (query >= 0)

    def range_states(self, q_first, q_last, k_first, k_last):
        count = self.count_before(k_last + 1) - self.count_before(k_first)
        return _states(count == k_last - k_first + 1, count == 0)

    def count_before(self, position: torch.Tensor) -> torch.Tensor:
        """How many summary positions lie before `position` (element-wise)."""
        into_block = (position % self.block_size - (self.block_size - self.width)).clamp(min=0)
        return position // self.block_size * self.width + into_block

    def positions(self, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
        """The summary positions below `seq_len`, in order: (n_summary_keys,) int64."""
        position = torch.arange(seq_len, device=device)
        return position[position % self.block_size >= self.block_size - self.width]

    def shift_invariant(self, period):
        return period % self.block_size == 0


@dataclass(frozen=True, eq=False)
class Random(Pattern):
    """Each query block sees a few key blocks drawn at random: `blocks[qb, kb]` True where
    query block qb sees key block kb (blocks of `block_size`). Build it with `draw`."""

    block_size: int
    blocks: torch.Tensor = field(repr=False)  # (n_blocks, n_blocks) bool

    @classmethod
    def draw(
        cls,
        seq_len: int,
        block_size: int,
        n_random: int,
        seed: int,
        *,
        causal: bool,
        look_backward: int = 0,
        look_forward: int = 0,
        skip_first: int = 0,
    ) -> Random:
        """Draw `n_random` distinct key blocks per query block with a `torch.Generator` seeded
        with `seed` (the same draw for the same arguments, on any device).

        As in BigBird, the candidates exclude the query block's own window (`look_backward`
        earlier and, unless causal, `look_forward` later blocks) and the first `skip_first`
        blocks (the global ones), so every draw adds keys; causally only earlier blocks are
        candidates. A query block with fewer candidates gets all of them.
        """
        n_blocks = -(-seq_len // block_size)
        generator = torch.Generator().manual_seed(seed)
        scores = torch.rand(n_blocks, n_blocks, generator=generator)  # (n, n) in [0, 1)
        query = torch.arange(n_blocks)[:, None]
        key = torch.arange(n_blocks)[None, :]
        window = (key >= query - look_backward) & (key <= query + (0 if causal else look_forward))
        candidate = ~window & (key >= skip_first)
        if causal:
            candidate &= key < query
        scores = scores.masked_fill(~candidate, -1.0)
        best, chosen = scores.topk(min(n_random, n_blocks), dim=1)  # (n, r) each
        blocks = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
        blocks.scatter_(1, chosen, best >= 0)
        return cls(block_size, blocks)

    def allows(self, query, key):
        blocks = self.blocks.to(query.device)
        return blocks[query // self.block_size, key // self.block_size]

    def range_states(self, q_first, q_last, k_first, k_last):
        # Allowed blocks in each rectangle of blocks, from 2-D prefix sums of the block table.
        b = self.block_size
        sums = torch.nn.functional.pad(self.blocks.long().cumsum(0).cumsum(1), (1, 0, 1, 0))
        q0, q1, k0, k1 = q_first // b, q_last // b + 1, k_first // b, k_last // b + 1
        count = sums[q1, k1] - sums[q0, k1] - sums[q1, k0] + sums[q0, k0]
        return _states(count == (q1 - q0) * (k1 - k0), count == 0)


@dataclass(frozen=True, eq=False)
class _Combination(Pattern):
    """Parts joined pair by pair (masks) and tile by tile (states)."""

    parts: tuple[Pattern, ...]

    def allows(self, query, key):
        return functools.reduce(self._join, (part.allows(query, key) for part in self.parts))

    def range_states(self, *ranges):
        states = (part.range_states(*ranges) for part in self.parts)
        return functools.reduce(self._join_states, states)

    def shift_invariant(self, period):
        return all(part.shift_invariant(period) for part in self.parts)


class Union(_Combination):
    """Pairs allowed by any part (each pair once)."""

    _join = staticmethod(torch.logical_or)
    _join_states = staticmethod(torch.maximum)  # FULL if any part is, EMPTY if all are


class Intersection(_Combination):
    """Pairs allowed by every part."""

    _join = staticmethod(torch.logical_and)
    _join_states = staticmethod(torch.minimum)  # EMPTY if any part is, FULL if all are


@dataclass(frozen=True, eq=False)
class Complement(Pattern):
    """Pairs the pattern does not allow."""

    pattern: Pattern

    def allows(self, query, key):
        return ~self.pattern.allows(query, key)

    def range_states(self, *ranges):
        return FULL - self.pattern.range_states(*ranges)

    def shift_invariant(self, period):
        return self.pattern.shift_invariant(period)


def union(parts) -> Pattern:
    """The union of a sequence of patterns (the pattern itself if there is one)."""
    parts = tuple(parts)
    return parts[0] if len(parts) == 1 else Union(parts)


def intersection(parts) -> Pattern:
    """The intersection of a sequence of patterns (the pattern itself if there is one)."""
    parts = tuple(parts)
    return parts[0] if len(parts) == 1 else Intersection(parts)
