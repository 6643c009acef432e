"""Combinations of fixed patterns (Longformer, BigBird, Sparse Transformer "fixed"), block-sparse.

The layer: `CombinedAttention`, the registry's entry (options, patterns, decoding). Its other
roles, beside it: `plan` (the disjoint pieces a pattern runs as at one length), `function`
(`CombinedPieces`: the pieces' forward and backward, an autograd function) and `presets` (the
Longformer, BigBird and Sparse Transformer shapes, registered under their own names).

The pattern is the union of `parts` from `variants.patterns`, intersected with `Causal` when
causal; a pair several parts allow is one key of one softmax. The union runs as disjoint pieces
(tiles of gathered key blocks, strided columns, summary columns, dense global rows) merged by
logsumexp, with no (L, L) tensor; a row no piece gives a key is zero. Masks are one more
condition on every pair of every piece. The random blocks' seed is fixed at construction
(`seed`, or one drawn from the model's seed).

The pieces and the masks in full: docs/variants/combined.md.
"""

from __future__ import annotations

import torch

from variants import patterns
from variants.attention.combined.function import CombinedPieces
from variants.attention.combined.plan import Plan
from variants.attention.common import flex
from variants.attention.common.base import Attention, pattern_length
from variants.attention.common.cache import WindowCache, attend_allowed
from variants.attention.common.columns import stride_at
from variants.attention.common.masking import repeat_kv
from variants.checks import (
    require_non_negative_int,
    require_positive_int,
    require_positive_int_or_auto,
)
from variants.registry import register_attention

PARTS = ("local", "strided", "global", "random", "summary")


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
    blocks, fixed for its life, as in BigBird. The parts that depend on a length (auto stride,
    random blocks) are taken at `pattern_length`: causally max(L, `max_seq_len`), the model's
    longest sequence, so that no output depends on how many tokens follow it (blocks drawn for
    L changed the first blocks' draws as tokens were appended); without causality at L.
    `strided` and `summary` cannot be combined (the Sparse Transformer's two alternatives).
    Options of parts not named are ignored.
    `impl="flex"` runs FlexAttention with the block mask of the same pattern.

    A key padding mask and segment ids (`forward`) restrict every pair of the pattern, global
    ones included: a global token attends and is attended only within its own document and
    never to padding (a padded query keeps only itself, if the pattern holds it, and its
    output is zero). A query whose pattern keys are all masked away gets a zero output; that
    needs a pattern without the query itself (neither `local` nor `strided`). `impl="flex"`
    takes neither.

    k and v may have fewer heads than q (grouped heads, `n_kv_heads`): every piece reads them
    as they are and the decode cache holds H_kv heads; `impl="flex"` repeats them to the H
    heads before FlexAttention.
    """

    family = "combined"
    takes_scale = True
    small_options = {"block_size": 8, "n_summary": 2}

    name = "combined"
    exact = False
    block_sparse_work = True
    time_complexity = "O(L k d), k keys per query"
    memory_complexity = "O(L b)"
    supports_decode = True
    softmax_kernels = "flash"
    independent_heads = True
    supports_padding_mask = supports_segments = True
    native_gqa = native_gqa_decode = True

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
        max_seq_len: int = 4096,
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
        # Not a limit (`Attention.max_seq_len` stays None): where length-dependent parts are
        # taken causally.
        self.model_max_len = require_positive_int(self.name, "max_seq_len", max_seq_len)
        # The seed the random blocks are drawn with: fixed at construction (module docstring).
        self.random_seed = seed
        if "random" in self.parts and seed is None:
            self.random_seed = int(torch.randint(2**31 - 1, ()))
        self._cache: dict = {}  # (kind, seq_len, device) -> pattern, plan or block mask

    def stride_for(self, seq_len: int) -> int:
        """The stride at `seq_len` (option or round(sqrt(n)), n its `pattern_length`), at
        most n: a longer stride is the same pattern (only j == i within the sequence)."""
        length = self.pattern_length(seq_len)
        return min(stride_at(self.stride, length), length)

    def pattern_length(self, seq_len: int) -> int:
        """The length the length-dependent parts are taken at for `seq_len` positions."""
        return pattern_length(seq_len, self.model_max_len, self.causal)

    def part_patterns(self, seq_len: int, at: int | None = None) -> dict[str, patterns.Pattern]:
        """Each named part's pattern at `seq_len`, before the causal cut. With `at`, the parts
        that depend on the length (auto stride, random blocks) are those of length `at`
        (decoding: the cache's max_len), restricted to the first `seq_len` positions; either
        way at its `pattern_length`."""
        b, causal = self.block_size, self.causal
        at = self.pattern_length(seq_len if at is None else at)
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
        return self._cached(kind, seq_len, device, lambda: self._new_plan(seq_len, device, at))

    def _new_plan(self, seq_len: int, device: torch.device | None, at: int | None) -> Plan:
        parts = self.part_patterns(seq_len, at)
        stride = min(self.stride_for(at or seq_len), seq_len) if "strided" in parts else None
        return Plan.build(
            parts,
            seq_len,
            device,
            causal=self.causal,
            block_size=self.block_size,
            n_global=self.n_global,
            stride=stride,
        )

    def supports_backward(self, device: torch.device) -> bool:
        return flex.supports_backward(self.impl, device)

    def unsupported_input(self, option: str) -> str | None:
        return flex.mask_reason(self.impl, option) or super().unsupported_input(option)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_len = q.shape[2]
        if self.impl == "flex":
            tile = min(self.block_size, seq_len)
            mask = self._cached(
                "flex",
                seq_len,
                q.device,
                lambda: flex.block_mask(self.pattern(seq_len), seq_len, tile, q.device),
            )
            # FlexAttention's own grouping is not taken (forward-only on CPU): keys repeated.
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])  # (B, H, L, D) each
            return flex.attend(self.name, q, k, v, mask)
        plan = self.plan(seq_len, q.device)  # shared by batch and heads, masks or not
        return CombinedPieces.apply(q, k, v, plan, attention_mask, segment_ids)  # (B, H, L, D)

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
            f"n_summary={self.n_summary}, seed={self.seed}, impl={self.impl}, "
            f"max_seq_len={self.model_max_len}"
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
