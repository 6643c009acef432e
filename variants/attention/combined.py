"""Combinations of fixed patterns (Longformer, BigBird, Sparse Transformer "fixed"), run
block-sparsely.

The pattern is the union of `parts` from the vocabulary of `variants.patterns`, intersected
with `Causal` when causal. A pair allowed by several parts is one key of one softmax: the union
is split into disjoint pieces by construction, each computed on the layout that makes it cheap
and merged with the others by logsumexp (`flash.merge_into`):

  tiles    per query block of `block_size`, the union of the key blocks it needs (local
           window, global key block, random blocks, its own block's summary columns), each
           block once, gathered into one key sequence and fed to the fused kernels with query
           blocks as heads; an element mask only where a tile is PARTIAL (the predicate,
           evaluated inside those tiles), no mask at all where every tile is FULL
  strided  every (i - j) mod stride == 0 pair, in the column layout of `strided.to_columns`
           (causal: the kernels' causal flag, no mask); the tiles leave those pairs out
  summary  the summary columns of other blocks: gathered once into one short key sequence;
           causally query block c sees exactly its first c * n_summary keys, a prefix
  rows     without causality, the first `n_global` queries see every key: one dense
           attention of those rows, which replaces whatever the other pieces gave them (it
           already holds every key), so they never make every tile of the first block needed

No (L, L) tensor exists: the tiles' mask is O(L * keys per query) bytes (uint8, cached per
length), turned into a float bias per range of query blocks as it is needed.
Rows that no piece gives a key (e.g. causal `random` alone in the first block) are zero, as a
softmax over nothing is taken to be (the tests' dense reference does the same).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from variants import patterns
from variants.attention import flash, flex
from variants.attention.base import Attention
from variants.attention.cache import WindowCache, attend_allowed
from variants.attention.local import to_blocks
from variants.attention.strided import from_columns, stride_at, to_columns
from variants.checks import (
    require_non_negative_int,
    require_positive_int,
    require_positive_int_or_auto,
)
from variants.registry import register_attention, register_preset

PARTS = ("local", "strided", "global", "random", "summary")
# The tiles run over ranges of query blocks whose gathered keys and values take about this
# much: temporaries of a few MiB are reused between calls, where larger ones came back as
# fresh pages every call and faulting them in cost as much as the attention (see lsh.py).
CHUNK_BYTES = 8 * 2**20


@register_attention
class CombinedAttention(Attention):
    """Union of fixed patterns (local, strided, global, random, summary), block-sparse.

    `parts` names the patterns of the union: `local` (own block, `look_backward` earlier and,
    when not causal, `look_forward` later blocks of `block_size`), `strided` ((i - j) mod
    `stride` == 0; 'auto' = round(sqrt(L))), `global` (the first `n_global` positions: every
    query sees them and, when not causal, they see every key), `random` (`n_random` key blocks
    per query block, drawn outside its local window and the global blocks, earlier ones only
    when causal) and `summary` (the last `n_summary` positions of every block: the Sparse
    Transformer's "fixed" pattern). `seed` fixes the random blocks; None draws the seed once
    from torch's RNG when the kernel is built, so each layer of a seeded model has its own
    blocks, fixed for its life, as in BigBird. `strided` and `summary` cannot be combined (the
    Sparse Transformer's two alternatives). Options of parts not named are ignored.
    `impl="flex"` runs FlexAttention with the block mask of the same pattern.
    """

    name = "combined"
    exact = False
    time_complexity = "O(L k d), k keys per query"
    memory_complexity = "O(L b)"
    supports_decode = True
    softmax_kernels = "flash"
    independent_heads = True

    def __init__(
        self,
        *,
        causal: bool = False,
        parts: tuple[str, ...] | list[str] = ("local", "global"),
        block_size: int = 64,
        look_backward: int = 1,
        look_forward: int = 1,
        stride: int | str = "auto",
        n_global: int = 1,
        n_random: int = 3,
        n_summary: int = 8,
        seed: int | None = None,
        impl: str = "native",
    ):
        super().__init__(causal=causal)
        self.parts = _require_parts(self.name, parts)
        self.block_size = require_positive_int(self.name, "block_size", block_size)
        self.look_backward = require_non_negative_int(self.name, "look_backward", look_backward)
        self.look_forward = require_non_negative_int(self.name, "look_forward", look_forward)
        self.stride = require_positive_int_or_auto(self.name, "stride", stride)
        self.n_global = require_positive_int(self.name, "n_global", n_global)
        self.n_random = require_positive_int(self.name, "n_random", n_random)
        self.n_summary = require_positive_int(self.name, "n_summary", n_summary)
        if "summary" in self.parts and self.n_summary > self.block_size:
            raise ValueError(
                f"{self.name}: option 'n_summary'={n_summary} must be at most "
                f"'block_size'={block_size} (summary columns of one block)"
            )
        if seed is not None:
            require_non_negative_int(self.name, "seed", seed)
        self.seed = seed
        self.impl = flex.require_impl(self.name, impl)
        # The seed the random blocks are drawn with: fixed at construction (see the docstring).
        self.random_seed = seed
        if "random" in self.parts and seed is None:
            self.random_seed = int(torch.randint(2**31 - 1, ()))
        self._cache: dict = {}  # (kind, seq_len, device) -> pattern, plan or block mask

    def stride_for(self, seq_len: int) -> int:
        """The stride at `seq_len` (option or round(sqrt(L))), at most L: a longer stride is
        the same pattern (only j == i within the sequence)."""
        return min(stride_at(self.stride, seq_len), seq_len)

    def part_patterns(self, seq_len: int, at: int | None = None) -> dict[str, patterns.Pattern]:
        """Each named part's pattern at `seq_len`, before the causal cut. With `at`, the parts
        that depend on the length (auto stride, random blocks) are those of length `at`
        (decoding: the cache's max_len), restricted to the first `seq_len` positions."""
        b, causal = self.block_size, self.causal
        at = seq_len if at is None else at
        forward = 0 if causal else self.look_forward
        table = {
            "local": lambda: patterns.Local(b, self.look_backward, forward),
            "strided": lambda: patterns.Strided(self.stride_for(at)),
            "global": lambda: patterns.Global(self.n_global, causal),
            "random": lambda: patterns.Random.draw(
                at,
                b,
                self.n_random,
                self.random_seed,
                causal=causal,
                look_backward=self.look_backward if "local" in self.parts else 0,
                look_forward=forward if "local" in self.parts else 0,
                skip_first=-(-self.n_global // b) if "global" in self.parts else 0,
            ),
            "summary": lambda: patterns.Summary(b, self.n_summary),
        }
        return {name: table[name]() for name in self.parts}

    def pattern(self, seq_len: int) -> patterns.Pattern:
        """The allowed pairs at `seq_len`: the union of the parts, intersected with `Causal`."""
        return self._cached("pattern", seq_len, "cpu", lambda: self._pattern(seq_len))

    def _pattern(self, seq_len: int) -> patterns.Pattern:
        union = patterns.union(self.part_patterns(seq_len).values())
        return union & patterns.Causal() if self.causal else union

    def plan(self, seq_len: int, device: torch.device | None = None, at: int | None = None) -> Plan:
        """How the pattern runs at `seq_len` on `device`: its disjoint pieces (`Plan`); with
        `at`, length-dependent parts taken at length `at` (`part_patterns`)."""
        kind = "plan" if at is None else f"plan@{at}"
        return self._cached(kind, seq_len, device, lambda: Plan.build(self, seq_len, device, at))

    def supports_backward(self, device: torch.device) -> bool:
        return flex.supports_backward(self.impl, device)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq_len = q.shape[2]
        if self.impl == "flex":
            tile = min(self.block_size, seq_len)
            mask = self._cached(
                "flex",
                seq_len,
                q.device,
                lambda: flex.block_mask(self.pattern(seq_len), seq_len, tile, q.device),
            )
            return flex.attend(self.name, q, k, v, mask)
        return CombinedPieces.apply(q, k, v, self.plan(seq_len, q.device))  # (B, H, L, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        return 4 * batch * heads * self.plan(seq_len).pairs() * head_dim

    # --- decoding: the local window in a ring, plus the older keys other parts still need ----
    def decode_window(self) -> int:
        """Positions the ring holds: the local part's window, else one block."""
        back = self.look_backward if "local" in self.parts else 0
        return (back + 1) * self.block_size

    def kept_positions(self, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        """Which positions (bool per entry) a query beyond the ring may still see: all of them
        with `strided`, the global tokens, the summary columns and every key block that some
        query block draws at random (at `max_len`). The local part never reaches past the
        ring."""
        keep = torch.zeros_like(positions, dtype=torch.bool)
        parts = self.part_patterns(max_len, at=max_len)
        if "strided" in parts:
            keep |= True
        if "global" in parts:
            keep |= positions < self.n_global
        if "summary" in parts:
            keep |= positions % self.block_size >= self.block_size - self.n_summary
        if "random" in parts:
            drawn = parts["random"].blocks.any(dim=0).to(positions.device)  # (n,) key blocks
            keep |= drawn[positions // self.block_size]
        return keep

    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        kept = self.kept_positions(torch.arange(max_len, device=device), max_len)  # (max_len,)
        return WindowCache(
            self.name, batch_size, n_heads, head_dim, window=self.decode_window(),
            keep=lambda positions: kept[positions], kept=int(kept.sum()),
            max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def prefill_attend(self, q, k, v, cache: WindowCache) -> torch.Tensor:
        plan = self.plan(q.shape[2], q.device, at=cache.max_len)
        return CombinedPieces.apply(q, k, v, plan)  # (B, H, T, D)

    def cache_prompt(self, q, k, v, cache: WindowCache) -> None:
        cache.append(k, v)

    def decode_step(self, q, k, v, cache: WindowCache) -> torch.Tensor:
        cache.append(k, v)
        pattern = self._cached(
            "pattern@", cache.max_len, "cpu", lambda: self._pattern(cache.max_len)
        )
        return attend_allowed(q, cache, pattern.allows)  # (B, H, 1, D)

    def _cached(self, kind: str, seq_len: int, device, build):
        key = (kind, seq_len, torch.device("cpu" if device is None else device))
        if key not in self._cache:
            # One length at a time is what a model runs; keep only the latest of each kind.
            for old in [k for k in self._cache if k[0] == kind]:
                del self._cache[old]
            self._cache[key] = build()
        return self._cache[key]

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, parts={self.parts}, block_size={self.block_size}, "
            f"look_backward={self.look_backward}, look_forward={self.look_forward}, "
            f"stride={self.stride}, n_global={self.n_global}, n_random={self.n_random}, "
            f"n_summary={self.n_summary}, seed={self.seed}, impl={self.impl}"
        )


def _require_parts(owner: str, parts) -> tuple[str, ...]:
    """`parts` as a tuple of known, distinct part names; `ValueError` naming the option else."""
    if isinstance(parts, str) or not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError(
            f"{owner}: option 'parts' must be a non-empty list of {', '.join(PARTS)}; got {parts!r}"
        )
    for part in parts:
        if part not in PARTS:
            raise ValueError(f"{owner}: option 'parts' may hold {', '.join(PARTS)}; got {part!r}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"{owner}: option 'parts' names a part twice: {list(parts)}")
    if "strided" in parts and "summary" in parts:
        raise ValueError(
            f"{owner}: option 'parts' cannot hold both 'strided' and 'summary' (the Sparse "
            "Transformer's two column patterns are alternatives; their pieces would overlap)"
        )
    return tuple(parts)


@dataclass(eq=False)
class Plan:
    """The pieces of one combined pattern at one length; all tensors on one device.

    Tiles: `tiles[c]` lists the key blocks query block c needs (K slots, position order,
    unused slots EMPTY), `kinds` their states and `hidden[c]` which of the gathered keys each
    of its queries may not see (EMPTY slots, padding, and the predicate's verdict inside
    PARTIAL slots; FULL slots are all visible): uint8, which converts to a float bias 4x as
    fast as bool (`flash.hidden_bias`), O(L K b) bytes.
    """

    seq_len: int
    block: int  # execution tile: block_size, or L when that is shorter
    tile_pattern: patterns.Pattern | None
    tiles: torch.Tensor  # (n, K) int64
    kinds: torch.Tensor  # (n, K) uint8
    hidden: torch.Tensor  # (n, b, K * b) uint8, 1 = hidden
    stride: int | None  # the strided piece's stride
    summary: patterns.Summary | None
    summary_keys: torch.Tensor | None  # (n_summary_keys,) int64 positions
    global_rows: int  # rows that see every key (non-causal global)
    causal: bool
    # The pairs of the tiles, strided and summary pieces (disjoint; in the global rows they are
    # computed, then replaced): for checks.
    pieces: dict[str, patterns.Pattern]

    @classmethod
    def build(cls, attention: CombinedAttention, seq_len: int, device, at=None) -> Plan:
        parts = attention.part_patterns(seq_len, at)
        causal, block_size = attention.causal, attention.block_size
        cut = (lambda p: p & patterns.Causal()) if causal else (lambda p: p)
        own_block = patterns.Local(block_size, 0, 0)
        pieces, excluded = {}, []
        if "strided" in parts:
            pieces["strided"] = cut(parts["strided"])
            excluded.append(parts["strided"])
        summary = parts.get("summary")
        if summary is not None:
            pieces["summary"] = cut(summary & ~own_block)
            excluded.append(summary & ~own_block)
        tile_parts = [parts[name] for name in ("local", "random") if name in parts]
        if "global" in parts:  # its key columns; its rows are a piece of their own
            tile_parts.append(patterns.Global(attention.n_global, causal=True))
        if summary is not None:
            tile_parts.append(summary & own_block)
        tile_pattern = None
        if tile_parts:
            tile_pattern = cut(
                patterns.intersection([patterns.union(tile_parts), *(~p for p in excluded)])
            )
            pieces["tiles"] = tile_pattern
        # Without causality the first n_global queries see every key: their own piece (the
        # other pieces' results in those rows are replaced).
        global_rows = min(attention.n_global, seq_len) if "global" in parts and not causal else 0
        block = min(block_size, seq_len)
        tiles, kinds, hidden = _tile_lists(tile_pattern, seq_len, block)
        summary_keys = None if summary is None else summary.positions(seq_len)
        plan = cls(
            seq_len=seq_len,
            block=block,
            tile_pattern=tile_pattern,
            tiles=tiles,
            kinds=kinds,
            hidden=hidden,
            stride=(
                min(attention.stride_for(at or seq_len), seq_len) if "strided" in parts else None
            ),
            summary=summary,
            summary_keys=summary_keys,
            global_rows=global_rows,
            causal=causal,
            pieces=pieces,
        )
        return plan.to(device)

    def to(self, device) -> Plan:
        for name in ("tiles", "kinds", "hidden", "summary_keys"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self

    @property
    def n_blocks(self) -> int:
        return self.tiles.shape[0]

    def tile_bias(self, first: int, end: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The additive bias of query blocks [first, end) against their gathered tiles:
        (1, m, b, K * b), 0 where allowed and `flash.masked_score` where not; None when every
        slot is FULL (no mask at all)."""
        if bool((self.kinds[first:end] == patterns.FULL).all()):
            return None
        return flash.hidden_bias(self.hidden[first:end], dtype)[None]

    def pairs(self) -> int:
        """Allowed pairs of the whole pattern, counted piece by piece (the pieces are
        disjoint): the tiles' visible keys per row, the strided and summary pieces in closed
        form, and L keys for each global row."""
        length, b = self.seq_len, self.block
        per_row = torch.zeros(self.n_blocks, b, dtype=torch.int64)  # (n, b)
        if self.tiles.shape[1]:
            per_row += (self.hidden == 0).sum(-1).cpu()  # FULL slots have nothing hidden
        per_row = per_row.flatten()[:length]  # (L,)
        position = torch.arange(length, dtype=torch.int64)
        if self.stride is not None:
            per_row += position // self.stride + 1
            if not self.causal:
                per_row += (length - 1 - position) // self.stride
        if self.summary is not None:
            block = self.summary.block_size
            n_keys = len(self.summary_keys)
            own_first = position // block * block
            before = self.summary.count_before(own_first)  # summary keys of earlier blocks
            if self.causal:
                per_row += before
            else:
                own_end = (own_first + block).clamp(max=length)
                per_row += n_keys - (self.summary.count_before(own_end) - before)
        per_row[: self.global_rows] = length
        return int(per_row.sum())


def _tile_lists(pattern: patterns.Pattern | None, seq_len: int, block: int):
    """The tile piece's block lists (see `Plan`): each query block's needed key blocks in
    position order, their states, and the keys hidden from each query: (n, K) int64, (n, K)
    uint8 and (n, b, K * b) uint8. The predicate is evaluated inside PARTIAL tiles only."""
    n_blocks = -(-seq_len // block)
    if pattern is None:
        empty = torch.zeros(n_blocks, 0, dtype=torch.int64)
        return empty, empty.to(torch.uint8), torch.zeros(n_blocks, block, 0, dtype=torch.uint8)
    states = pattern.tile_states(seq_len, block)  # (n, n)
    if seq_len % block:  # the last key block holds padding, which a mask must hide
        last = states[:, -1]
        last[last == patterns.FULL] = patterns.PARTIAL
    needed = states != patterns.EMPTY
    slots = max(1, int(needed.sum(1).max()))
    order = torch.sort((~needed).to(torch.uint8), dim=1, stable=True).indices  # needed first
    tiles = order[:, :slots].contiguous()  # (n, K)
    kinds = states.gather(1, tiles)  # (n, K); EMPTY in unused slots
    tiles[kinds == patterns.EMPTY] = 0  # any real block: its keys are all hidden
    hidden = (kinds == patterns.EMPTY).to(torch.uint8)[:, :, None, None]  # (n, K, 1, 1)
    hidden = hidden.expand(-1, -1, block, block).contiguous()  # (n, K, b, b)
    query_block, slot = (kinds == patterns.PARTIAL).nonzero(as_tuple=True)  # (P,) each
    offset = torch.arange(block)
    query = (query_block[:, None] * block + offset)[:, :, None]  # (P, b, 1)
    key = (tiles[query_block, slot][:, None] * block + offset)[:, None, :]  # (P, 1, b)
    last = seq_len - 1  # padded positions evaluated at a real one, then hidden
    allowed = pattern.allows(query.clamp(max=last), key.clamp(max=last)) & (key < seq_len)
    hidden[query_block, slot] = (~allowed).to(torch.uint8)
    hidden = hidden.transpose(1, 2).reshape(n_blocks, block, slots * block)  # (n, b, K*b)
    return tiles, kinds, hidden


class CombinedPieces(torch.autograd.Function):
    """The pieces of a `Plan` attended and merged by logsumexp; the backward runs each piece's
    attention backward given the merged output and logsumexp (`flash`), so nothing per pair is
    saved: q, k, v, the output and its logsumexp (O(L d))."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan):
        """q, k, v: (B, H, L, D). Returns (B, H, L, D)."""
        pieces = Pieces(plan, q)
        out, lse = pieces.tiles_forward(q, k, v)  # (B, H, n*b, D), (B, H, n*b)
        view_out, view_lse = out[:, :, : plan.seq_len], lse[:, :, : plan.seq_len, None]
        if plan.stride is not None:
            pieces.strided_forward(q, k, v, view_out, view_lse)
        if plan.summary is not None:
            pieces.summary_forward(q, k, v, view_out, view_lse)
        if plan.global_rows:
            pieces.rows_forward(q, k, v, view_out, view_lse)
        # A row no piece gave a key has an lse of about MASKED_SCORE: its softmax is over
        # nothing, taken to be 0 (and no gradient flows through it).
        empty = view_lse[..., 0] < flash.masked_score(q.dtype) / 2  # (B, H, L)
        pieces.empty = empty if bool(empty.any()) else None
        if pieces.empty is not None:
            view_out[pieces.empty] = 0
        ctx.pieces = pieces
        ctx.save_for_backward(q, k, v, out, lse)
        return view_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        pieces, plan = ctx.pieces, ctx.pieces.plan
        length, rows = plan.seq_len, plan.global_rows
        grads = [torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)]
        # The global rows' gradient is their own piece's; every other piece sees zeros there.
        sparse = grad_out.clone(memory_format=torch.contiguous_format)  # (B, H, L, D)
        sparse[:, :, :rows] = 0
        if pieces.empty is not None:
            sparse[pieces.empty] = 0
        view_out, view_lse = out[:, :, :length], lse[:, :, :length]
        pieces.tiles_backward(sparse, q, k, v, out, lse, grads)
        if plan.stride is not None:
            pieces.strided_backward(sparse, q, k, v, view_out, view_lse, grads)
        if plan.summary is not None:
            pieces.summary_backward(sparse, q, k, v, view_out, view_lse, grads)
        if rows:
            pieces.rows_backward(grad_out, q, k, v, view_out, view_lse, grads)
        return *grads, None


class Pieces:
    """Each piece's forward (merging into the running output and logsumexp) and backward
    (adding into the gradients), for one call's shapes."""

    def __init__(self, plan: Plan, q: torch.Tensor):
        self.plan = plan
        self.batch, self.heads, _, self.head_dim = q.shape
        self.scale = self.head_dim**-0.5
        self.empty = None
        slots = max(plan.tiles.shape[1], 1)
        per_block = 2 * self.batch * self.heads * slots * plan.block * self.head_dim
        self.chunk = max(1, CHUNK_BYTES // (per_block * q.element_size()))

    # --- tiles -----------------------------------------------------------------------------
    def _chunks(self):
        for first in range(0, self.plan.n_blocks, self.chunk):
            yield first, min(first + self.chunk, self.plan.n_blocks)

    def _flat_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, D) -> (B*H, n, b*D): a whole block per row, so that gathering tiles is
        one `index_select` along dim 1 (along the block dim of a 5-d view it ran 5-9x
        slower)."""
        blocks = to_blocks(x, self.plan.block)  # (B, H, n, b, D)
        return blocks.reshape(self.batch * self.heads, self.plan.n_blocks, -1)

    def _gather(self, flat: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """The tiles of query blocks [first, end) from `_flat_blocks` keys or values:
        (B*H, m, K*b, D), one contiguous copy."""
        gathered = flat.index_select(1, self.plan.tiles[first:end].flatten())  # (B*H, m*K, b*D)
        return gathered.view(self.batch * self.heads, end - first, -1, self.head_dim)

    def _query_blocks(self, x: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """(B, H, n, b, E) -> blocks [first, end) as (B*H, m, b, E)."""
        return x[:, :, first:end].reshape(self.batch * self.heads, end - first, *x.shape[3:])

    def tiles_forward(self, q, k, v):
        """The tile piece over the padded length: out (B, H, n*b, D), lse (B, H, n*b)."""
        plan, b = self.plan, self.plan.block
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        out = q.new_zeros(self.batch, self.heads, plan.n_blocks * b, self.head_dim)
        lse = torch.full(
            out.shape[:3], flash.masked_score(q.dtype), dtype=lse_dtype, device=q.device
        )
        if plan.tile_pattern is None:
            return out, lse
        q_blocks = to_blocks(q, b)  # (B, H, n, b, D)
        k_flat, v_flat = self._flat_blocks(k), self._flat_blocks(v)  # (B*H, n, b*D)
        out_blocks = out.view(self.batch, self.heads, plan.n_blocks, b, self.head_dim)
        lse_blocks = lse.view(self.batch, self.heads, plan.n_blocks, b)
        for first, end in self._chunks():
            chunk_out, chunk_lse = flash.attend(
                self._query_blocks(q_blocks, first, end),
                self._gather(k_flat, first, end),
                self._gather(v_flat, first, end),
                scale=self.scale,
                bias=plan.tile_bias(first, end, q.dtype),
            )  # (B*H, m, b, D), (B*H, m, b)
            shape = (self.batch, self.heads, end - first, b)
            out_blocks[:, :, first:end] = chunk_out.view(*shape, self.head_dim)
            lse_blocks[:, :, first:end] = chunk_lse.view(shape)
        return out, lse

    def tiles_backward(self, grad, q, k, v, out, lse, grads):
        plan, b = self.plan, self.plan.block
        if plan.tile_pattern is None:
            return
        q_blocks, grad_blocks = to_blocks(q, b), to_blocks(grad, b)  # (B, H, n, b, D)
        k_flat, v_flat = self._flat_blocks(k), self._flat_blocks(v)  # (B*H, n, b*D)
        out_blocks = out.view(self.batch, self.heads, plan.n_blocks, b, self.head_dim)
        lse_blocks = lse.view(self.batch, self.heads, plan.n_blocks, b, 1)
        grad_q = torch.zeros_like(q_blocks, memory_format=torch.contiguous_format)
        grad_k, grad_v = torch.zeros_like(k_flat), torch.zeros_like(v_flat)  # (B*H, n, b*D)
        for first, end in self._chunks():
            chunk_q, chunk_k, chunk_v = flash.attend_backward(
                self._query_blocks(grad_blocks, first, end),
                self._query_blocks(q_blocks, first, end),
                self._gather(k_flat, first, end),
                self._gather(v_flat, first, end),
                self._query_blocks(out_blocks, first, end),
                self._query_blocks(lse_blocks, first, end).squeeze(-1),
                scale=self.scale,
                bias=plan.tile_bias(first, end, q.dtype),
            )  # (B*H, m, b, D), (B*H, m, K*b, D) twice
            m = end - first
            grad_q[:, :, first:end] = chunk_q.view(self.batch, self.heads, m, b, self.head_dim)
            index = plan.tiles[first:end].flatten()  # (m*K,)
            for total, chunk in ((grad_k, chunk_k), (grad_v, chunk_v)):
                total.index_add_(
                    1, index, chunk.reshape(self.batch * self.heads, -1, b * self.head_dim)
                )
        length, shape = plan.seq_len, (self.batch, self.heads, -1, self.head_dim)
        grads[0] += grad_q.flatten(2, 3)[:, :, :length]
        grads[1] += grad_k.view(shape)[:, :, :length]
        grads[2] += grad_v.view(shape)[:, :, :length]

    # --- strided -----------------------------------------------------------------------------
    def _strided_options(self, q):
        plan, stride = self.plan, self.plan.stride
        if plan.causal:
            return {"scale": self.scale, "causal": True}
        rows = -(-plan.seq_len // stride)
        if rows * stride == plan.seq_len:
            return {"scale": self.scale}
        # Unmasked, a column's query sees every real row of it: hide the padded keys.
        position = torch.arange(rows, device=q.device) * stride
        position = position[None, :] + torch.arange(stride, device=q.device)[:, None]
        hidden = (position >= plan.seq_len)[None, :, None, :]  # (1, s, 1, rows)
        return {"scale": self.scale, "bias": flash.hidden_bias(hidden, q.dtype)}

    def strided_forward(self, q, k, v, out, lse):
        stride, length = self.plan.stride, self.plan.seq_len
        columns = (to_columns(x, stride).contiguous() for x in (q, k, v))  # (B*H, s, rows, D)
        part_out, part_lse = flash.attend(*columns, **self._strided_options(q))
        part_out = from_columns(part_out, self.batch, self.heads)[:, :, :length]
        part_lse = from_columns(part_lse.unsqueeze(-1), self.batch, self.heads)[:, :, :length]
        flash.merge_into(out, lse, part_out, part_lse)

    def strided_backward(self, grad, q, k, v, out, lse, grads):
        stride, length = self.plan.stride, self.plan.seq_len
        columns = [to_columns(x, stride).contiguous() for x in (grad, q, k, v, out)]
        lse_columns = to_columns(lse.unsqueeze(-1), stride).squeeze(-1).contiguous()
        pieces = flash.attend_backward(*columns, lse_columns, **self._strided_options(q))
        for total, piece in zip(grads, pieces, strict=True):
            total += from_columns(piece, self.batch, self.heads)[:, :, :length]

    # --- summary -----------------------------------------------------------------------------
    def _summary_calls(self, q):
        """Per query block of the summary pattern: (its rows, how many summary keys from the
        start it sees, a bias hiding its own block's keys or None)."""
        plan, summary = self.plan, self.plan.summary
        block, n_keys = summary.block_size, len(plan.summary_keys)
        for first in range(0, plan.seq_len, block):
            rows = slice(first, min(first + block, plan.seq_len))
            before = int(summary.count_before(torch.tensor(first)))
            if plan.causal:
                if before:
                    yield rows, before, None
                continue
            own = int(summary.count_before(torch.tensor(rows.stop))) - before
            if own == n_keys:
                continue
            hidden = torch.zeros(n_keys, dtype=torch.bool, device=q.device)
            hidden[before : before + own] = True
            yield rows, n_keys, flash.hidden_bias(hidden, q.dtype).view(1, 1, 1, n_keys)

    def summary_forward(self, q, k, v, out, lse):
        keys, values = (x.index_select(2, self.plan.summary_keys) for x in (k, v))
        for rows, count, bias in self._summary_calls(q):
            part_out, part_lse = flash.attend(
                q[:, :, rows], keys[:, :, :count], values[:, :, :count], scale=self.scale, bias=bias
            )  # (B, H, r, D), (B, H, r)
            flash.merge_into(out[:, :, rows], lse[:, :, rows], part_out, part_lse.unsqueeze(-1))

    def summary_backward(self, grad, q, k, v, out, lse, grads):
        index = self.plan.summary_keys
        keys, values = (x.index_select(2, index) for x in (k, v))  # (B, H, C, D)
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)
        for rows, count, bias in self._summary_calls(q):
            grad_q, grad_k, grad_v = flash.attend_backward(
                grad[:, :, rows].contiguous(),
                q[:, :, rows],
                keys[:, :, :count],
                values[:, :, :count],
                out[:, :, rows].contiguous(),
                lse[:, :, rows].contiguous(),
                scale=self.scale,
                bias=bias,
            )
            grads[0][:, :, rows] += grad_q
            grad_keys[:, :, :count] += grad_k
            grad_values[:, :, :count] += grad_v
        grads[1].index_add_(2, index, grad_keys)
        grads[2].index_add_(2, index, grad_values)

    # --- global rows -------------------------------------------------------------------------
    def rows_forward(self, q, k, v, out, lse):
        rows = self.plan.global_rows
        part_out, part_lse = flash.attend(q[:, :, :rows], k, v, scale=self.scale)
        out[:, :, :rows] = part_out  # these rows see every key: nothing to merge
        lse[:, :, :rows, 0] = part_lse

    def rows_backward(self, grad, q, k, v, out, lse, grads):
        rows = self.plan.global_rows
        grad_q, grad_k, grad_v = flash.attend_backward(
            grad[:, :, :rows].contiguous(),
            q[:, :, :rows],
            k,
            v,
            out[:, :, :rows].contiguous(),
            lse[:, :, :rows].contiguous(),
            scale=self.scale,
        )
        grads[0][:, :, :rows] += grad_q
        grads[1] += grad_k
        grads[2] += grad_v


# The systems people know, with their published shapes (docs/variants.md: "combined").
register_preset(
    "longformer",
    CombinedAttention,
    "Longformer: a sliding window (blocks of 128, two each side) plus global tokens.",
    parts=("local", "global"),
    block_size=128,
    look_backward=2,
    look_forward=2,
    n_global=1,
)
register_preset(
    "bigbird",
    CombinedAttention,
    "BigBird: a window of 3 blocks of 64, a global block and 3 random blocks per query block.",
    parts=("local", "global", "random"),
    block_size=64,
    look_backward=1,
    look_forward=1,
    n_global=64,
    n_random=3,
)
register_preset(
    "sparse_fixed",
    CombinedAttention,
    "Sparse Transformer fixed: blocks of 128 plus each block's last 32 positions (summaries).",
    parts=("local", "summary"),
    block_size=128,
    look_backward=0,
    look_forward=0,
    n_summary=32,
)
