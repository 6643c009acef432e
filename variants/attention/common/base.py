"""The contract every attention variant fulfils, and the small pieces they share.

A variant subclasses `Attention`, declares its capabilities as class attributes, takes its
options as keyword-only constructor arguments (their defaults are the registry's defaults) and
implements `attend(q, k, v)` and `flops(...)`. A causal variant that decodes sets
`supports_decode = True` and implements `new_cache`, `cache_prompt` and `decode_step` (and
`prefill_attend` where its pattern depends on a length, taken at `pattern_length`); the public
`init_cache`, `prefill` and `decode` check every input against the cache before any hook runs
and run the hooks without autograd, in eval mode; prefill takes a left-padded prompt where the
kernel can (`padded_prefill_reason`). `forward` takes `attention_mask` (B, L), **True = a real
token**, and `segment_ids` (B, L) where the class supports them (else `UnsupportedCombination`),
hands them to `attend` as keywords only when given, and zeroes padded queries' outputs. k and v
may have H_kv heads dividing q's H: `native_gqa` kernels take them as they are, others repeated.

The decoding hooks, left-padded prefill, masks and grouped heads in full: docs/variants/common.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common import flash, flex, left_padding
from variants.attention.common.masking import (
    repeat_kv,
    zero_padded_positions,
    zero_padded_queries,
)
from variants.checks import (
    UnsupportedCombination,
    check_attention_mask,
    check_qkv,
    check_segment_ids,
    require_bool,
    require_positive_int,
    require_positive_number,
    token_mask,
)
from variants.patterns import Pattern

# Useful FLOPs of forward+backward as a multiple of forward FLOPs. Backward of softmax(QK^T)V
# needs dV, dP, dQ, dK (4 matmuls) plus one recompute of QK^T in fused kernels: (2 + 5) / 2.
# This is the convention of FlashAttention's reported figures (docs/measurements.md, FLOPs).
FWD_BWD_FLOP_FACTOR = 3.5
# Why a kernel that is not `shift_invariant` takes no left-padded batch (prefill, variants.hf).
MOVED_BY_LEFT_PADDING = (
    "its pattern is absolute in position (blocks, chunks, sinks), so left padding would move "
    "a row's pattern"
)
# Shared-QK keys are k / max(|k|, eps), as F.normalize: padded (zero) positions give zero keys.
SHARED_QK_NORM_EPS = 1e-12


class Attention(nn.Module):
    """Base class: validate inputs, then delegate to `attend`."""

    name: ClassVar[str]
    # Its place in the survey's taxonomy (`variants.registry.FAMILIES`): the registry lists
    # variants family by family.
    family: ClassVar[str] = "other"
    exact: ClassVar[bool]
    time_complexity: ClassVar[str]
    memory_complexity: ClassVar[str]
    causal_supported: ClassVar[bool] = True
    causal_reason: ClassVar[str] = ""  # why causal is unsupported, shown in the error
    shared_qk_required: ClassVar[bool] = False
    bounded_length: ClassVar[bool] = False
    # Causal-only variants (a recurrence over positions, branches defined on the past) refuse
    # causal=False with `bidirectional_reason`.
    bidirectional_supported: ClassVar[bool] = True
    bidirectional_reason: ClassVar[str] = ""
    # Per-token gates the kernel needs (NSA's branch gates, DeltaNet's beta): the layer projects
    # the token to (B, H, L, n_gates), applies a sigmoid and calls attn(q, k, v, gates=g).
    n_gates: ClassVar[int] = 0
    supports_decode: ClassVar[bool] = False
    decode_reason: ClassVar[str] = "it has no decode path"
    decode_matches_forward: ClassVar[bool] = True
    # Its `prefill_attend` takes `attention_mask` and its `decode_step` leaves out the cache's
    # pad slots (`Cache.real_keys`): a cache of positions then takes left-padded prompts.
    decode_masks_padding: ClassVar[bool] = False
    # True if each head's output depends on that head's q, k, v and its own rows of the
    # per-head weights alone, with no state or per-call draws shared by heads: the layer may
    # then run groups of heads as separate calls (`model.attention_chunks`) and get exactly the
    # output of one call. A kernel with per-head weights reads them through `of_heads`, which
    # gives the rows of the heads a grouped call computes (`computing_heads`).
    independent_heads: ClassVar[bool] = False
    # The layer's heads (indices) the current call computes, None: all (`computing_heads`).
    _computed_heads: torch.Tensor | None = None
    # True if the kernel's work is a set of (query block, key block) pairs (exact attention
    # through SDPA's tiles, the fixed and the selected block patterns), so a mask that empties a
    # block could drop that block's work: benchmarks/mask_cost.py holds what a mask costs such a
    # kernel to its bound, not a kernel whose work has no blocks to skip (a state
    # over the sequence, LSH's or routing's sorted windows, Linformer's projection).
    block_sparse_work: ClassVar[bool] = False
    # How its softmax attention runs: "flash" (parts merged by logsumexp through
    # `flash.attend`: fused where `flash.path` says so), "sdpa" (PyTorch's fused SDPA), or None
    # (no fused attention kernel: explicit matmuls of its own). Read by `kernel_path`.
    softmax_kernels: ClassVar[str | None] = None
    # Masks (`forward`'s attention_mask, segment_ids), grouped KV heads: docs/variants/common.md.
    supports_padding_mask: ClassVar[bool] = False
    padding_mask_reason: ClassVar[str] = "its kernel takes no key padding mask yet"
    supports_segments: ClassVar[bool] = False
    segments_reason: ClassVar[str] = "its kernel takes no document mask yet"
    supports_gqa: ClassVar[bool] = True
    gqa_reason: ClassVar[str] = ""
    native_gqa: ClassVar[bool] = False  # attend takes k, v of H_kv heads (else: repeated)
    native_gqa_decode: ClassVar[bool] = False  # its cache holds H_kv heads (else: H)
    # The options that set how closely it approximates exact attention, the first the main one
    # (the report draws error against it); `smaller_is_finer`: those finer when smaller.
    knobs: ClassVar[tuple[str, ...]] = ()
    smaller_is_finer: ClassVar[tuple[str, ...]] = ()
    # The published model it is in each suite's table (suite -> model, e.g. {"lra": "Reformer"}):
    # the tables that set published rows beside ours read it (analysis/suites.py).
    published_as: ClassVar[Mapping[str, str]] = {}
    # Its output reads q only through softmax(q k / sqrt(D)) scores, so forward's `scale` is a
    # scaled q (not so for linear or delta rules, or a kernel that normalises q).
    takes_scale: ClassVar[bool] = False
    # Causally, an output never changes when tokens are appended (the conformance kit checks
    # it); False, with the reason, only where it cannot hold (LSH's chunk boundaries).
    past_fixed: ClassVar[bool] = True
    past_fixed_reason: ClassVar[str] = ""
    # Options that exercise its structure (several blocks, chunks, clusters) at the short
    # lengths of the conformance kit (`variants.conformance`).
    small_options: ClassVar[dict] = {}

    def __init__(self, *, causal: bool = False):
        super().__init__()
        self.causal = require_bool(self.name, "causal", causal)

    @property
    def max_seq_len(self) -> int | None:
        """Longest sequence this instance accepts, or None if unbounded."""
        return None

    @property
    def shift_invariant(self) -> bool:
        """True if its pattern depends on positions only through i - j (and on content), so
        that left padding leaves a row's real outputs as the row alone gives them (a padded
        batch of prompts); block grids and sink positions are absolute, so False by default."""
        return False

    @property
    def applies_shared_qk(self) -> bool:
        """True if the kernel derives its keys from k = q itself under the Reformer's rule
        (unit keys, no attending to oneself unless alone): LSH always, `full` and `blockwise`
        when built with `shared_qk=True`."""
        return self.shared_qk_required or getattr(self, "shared_qk", False)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        gates: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q: (batch, heads, seq_len, head_dim), k, v: (batch, kv_heads, seq_len, head_dim)
        with kv_heads dividing heads (grouped KV heads; kv_heads = heads by default) ->
        (batch, heads, seq_len, head_dim).

        scale: the softmax's scale (default 1/sqrt(head_dim)), as SDPA's, where the variant
        `takes_scale` (its output reads q only through softmax scores: q is scaled by
        scale * sqrt(head_dim)). q may be shorter than k, v (T_q < T_k: the last T_q
        positions of a causal context, chunked prefill) where the variant is causal, ungated,
        has separate keys and a fixed past; the others refuse both in one line.

        gates: (batch, heads, seq_len, n_gates) in (0, 1), required by (and only by) a variant
        with `n_gates` > 0, which then receives them as `attend(q, k, v, gates)`.

        attention_mask: (batch, seq_len) bool or 0/1, **True = a real token (keep), False =
        padding** (Hugging Face's and SDPA's convention). PyTorch's `key_padding_mask` (True =
        padding) is refused by name, never read either way. Padded keys are never attended
        to; the outputs at padded queries are zeros (and pass no gradient). Padded positions
        of q, k, v and gates reach `attend` as zeros, so whatever they hold (NaN, inf) never
        reaches a real output or gradient. A NaN in a real token may reach every output of
        its sequence, causal or not (0 * NaN in masked products, as in PyTorch's SDPA), never
        another sequence's.
        segment_ids: (batch, seq_len) integer document ids of packed sequences, non-decreasing
        along seq_len: no query attends a key of another document.
        Either raises `UnsupportedCombination` on a variant that cannot take it
        (`supports_padding_mask`, `supports_segments`, `unsupported_input`), and `ValueError`
        if mis-shaped or of the wrong dtype.

        q, k, v must be floating point (`check_qkv`). An empty batch (batch 0) never reaches
        `attend`: its output is empty (`empty_batch_output`), and backward goes through it.
        """
        check_qkv(self.name, q, k, v, fewer_queries=True)
        attention_mask = token_mask(self.name, attention_mask, key_padding_mask)
        if scale is not None:
            q = self._scaled(q, scale)
        if q.shape[2] < k.shape[2]:
            return self._last_queries(q, k, v, gates, attention_mask, segment_ids)
        limit = self.max_seq_len
        if limit is not None and q.shape[2] > limit:
            raise ValueError(
                f"{self.name}: seq_len {q.shape[2]} exceeds option 'max_seq_len'={limit}"
            )
        gated = self._gated(q, gates)
        masks = self._masks(q, k, attention_mask, segment_ids)
        if q.shape[0] == 0:
            return empty_batch_output(q, k, v, *gated)
        if attention_mask is not None:
            # Masks keep padded values out of every real output, but not out of the arithmetic:
            # a padded key's score is computed before its mask applies, a hidden value is
            # multiplied by probability 0, and NaN + bias or 0 * inf is NaN. Zeros selected in
            # their place (not multiplied in) make any padded value read as a finite one would.
            # One zeroed tensor per distinct input: under shared QK k is q, and stays so (the
            # kernels' gradients of q then sum in the order they did).
            zeroed = {}
            for x in (q, k, v, *gated):
                if id(x) not in zeroed:
                    zeroed[id(x)] = zero_padded_positions(x, attention_mask)
            q, k, v, *gated = (zeroed[id(x)] for x in (q, k, v, *gated))
        if not self.native_gqa:
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])  # (B, H, L, D) each
        out = self.attend(q, k, v, *gated, **masks)  # (B, H, L, D)
        return zero_padded_queries(out, attention_mask)

    def _scaled(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q such that the kernel's own 1/sqrt(D) gives softmax scale `scale`."""
        if not self.takes_scale:
            raise UnsupportedCombination(
                f"attention {self.name!r} does not support option 'scale': its output is not a "
                "softmax of scaled scores (or it normalises q)"
            )
        scale = require_positive_number(self.name, "scale", scale)
        return q * (scale * math.sqrt(q.shape[-1]))

    def _last_queries(self, q, k, v, gates, attention_mask, segment_ids) -> torch.Tensor:
        """q (B, H, T_q, D) as the last T_q positions of the T_k keys: the causal forward
        with zero queries before them, their outputs dropped (a query's row reads only itself
        and the keys where `past_fixed` and no gate or shared key ties rows together)."""
        why = None
        if not self.causal:
            why = "a bidirectional kernel has no meaning for queries shorter than its keys"
        elif self.n_gates or self.applies_shared_qk or not self.past_fixed:
            why = "its rows depend on every position's gates, queries or the whole sequence"
        elif segment_ids is not None:
            why = "segment_ids need queries and keys of one length"
        if why:
            raise UnsupportedCombination(
                f"attention {self.name!r}: q of {q.shape[2]} positions over k of "
                f"{k.shape[2]}: {why}"
            )
        before = q.new_zeros(*q.shape[:2], k.shape[2] - q.shape[2], q.shape[3])
        whole = torch.cat([before, q], dim=2)  # (B, H, T_k, D)
        return self(whole, k, v, attention_mask=attention_mask)[:, :, -q.shape[2] :]

    def unsupported_input(self, option: str) -> str | None:
        """Why this instance cannot take input `option` (attention_mask, segment_ids or
        grouped KV heads, "n_kv_heads"), or None if it can: the class flags by default."""
        supported, reason = {
            "attention_mask": (self.supports_padding_mask, self.padding_mask_reason),
            "segment_ids": (self.supports_segments, self.segments_reason),
            "n_kv_heads": (self.supports_gqa and not self.applies_shared_qk, self.gqa_reason),
        }[option]
        if supported:
            return None
        if option == "n_kv_heads" and self.applies_shared_qk:
            return "under shared QK its keys are the queries, one per query head"
        return reason

    def refuse_unsupported(self, option: str) -> None:
        """`UnsupportedCombination` naming this variant and `option` if it cannot take it."""
        reason = self.unsupported_input(option)
        if reason is not None:
            raise UnsupportedCombination(
                f"attention {self.name!r} does not support option {option!r}: {reason}"
            )

    def _masks(self, q, k, attention_mask, segment_ids) -> dict[str, torch.Tensor]:
        """The masks given, checked, as `attend`'s keyword arguments; raises for an input this
        variant cannot take (grouped KV heads included)."""
        if k.shape[1] != q.shape[1]:
            self.refuse_unsupported("n_kv_heads")
        masks = {}
        if attention_mask is not None:
            check_attention_mask(self.name, attention_mask, q)
            self.refuse_unsupported("attention_mask")
            masks["attention_mask"] = attention_mask
        if segment_ids is not None:
            check_segment_ids(self.name, segment_ids, q)
            self.refuse_unsupported("segment_ids")
            masks["segment_ids"] = segment_ids
        return masks

    def _gated(self, q: torch.Tensor, gates: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The extra arguments of `attend` and the decoding hooks: (gates,) for a gated
        variant, () otherwise; `ValueError` if gates are missing, not taken or mis-shaped."""
        if not self.n_gates:
            if gates is not None:
                raise ValueError(f"{self.name}: option 'gates' is not taken (n_gates=0)")
            return ()
        if gates is None:
            raise ValueError(
                f"{self.name}: option 'gates' is required: (batch, heads, seq_len, "
                f"{self.n_gates}) values in (0, 1) from the token"
            )
        wanted = (*q.shape[:3], self.n_gates)
        if gates.shape != wanted:
            raise ValueError(
                f"{self.name}: option 'gates' must have shape (batch, heads, seq_len, "
                f"{self.n_gates}) = {wanted}, got {tuple(gates.shape)}"
            )
        return (gates,)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # --- decoding ----------------------------------------------------------------------------
    def init_cache(
        self,
        batch_size: int,
        n_heads: int,
        head_dim: int,
        *,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        n_kv_heads: int | None = None,
    ):
        """An empty decoding cache for up to `max_len` positions (`common.cache`).

        `n_heads` is the queries' heads; `n_kv_heads` (default n_heads) the keys' (grouped KV
        heads), which the cache of a `native_gqa_decode` variant holds (the others hold
        n_heads, the keys repeated).

        `ValueError` if this variant cannot decode (`decode_reason`), is not causal, or
        `batch_size` is not positive (a cache of no sequences: the forward takes an empty
        batch, decoding does not). Patterns that depend on a length (auto stride, random
        blocks) are taken at `pattern_length(max_len, max_seq_len, True)`: decoding then equals
        the causal forward whatever the prompt's length if max_len <= max_seq_len (as in a
        model), else the forward over max_len positions.
        """
        if not self.supports_decode:
            raise ValueError(f"{self.name}: cannot decode: {self.decode_reason}")
        if not self.causal:
            raise ValueError(f"{self.name}: decode needs option causal=True")
        require_positive_int(self.name, "batch_size", batch_size)
        if n_kv_heads is not None and n_kv_heads != n_heads:
            require_positive_int(self.name, "n_kv_heads", n_kv_heads)
            if n_heads % n_kv_heads:
                raise ValueError(
                    f"{self.name}: option 'n_kv_heads'={n_kv_heads} must divide 'n_heads'={n_heads}"
                )
            self.refuse_unsupported("n_kv_heads")
        held = n_kv_heads if self.native_gqa_decode and n_kv_heads is not None else n_heads
        cache = self.new_cache(
            batch_size, held, head_dim, max_len=max_len, device=device, dtype=dtype
        )
        cache.query_heads = n_heads
        return cache

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache,
        gates: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The causal forward over a prompt, q, k, v (B, H, T, D) -> (B, H, T, D); leaves the
        (empty) cache as if the prompt had been decoded token by token. `gates`
        (B, H, T, n_gates): as the forward's, for (and only for) a gated variant.

        attention_mask: (B, T) bool or 0/1, True = a real token, left padding (each row's pads
        first): each row's outputs, and every later decode step, are those of its real tokens
        alone; padded queries' outputs are zeros. `UnsupportedCombination` where the kernel
        cannot (`padded_prefill_reason`); a mask without pads is no mask."""
        check_qkv(self.name, q, k, v)
        if cache.length:
            raise ValueError(f"{self.name}: prefill needs an empty cache, it holds {cache.length}")
        self._check_fit("prefill", q, k, v, cache, gates)
        gated = self._gated(q, gates)
        pads = left_padding.prompt_pads(self, q, cache, attention_mask)  # (B,) or None
        k, v = self._decoding_heads(q, k, v)
        if pads is None:
            return self._run(self.prefill_into, q, k, v, cache, *gated)  # (B, H, T, D)
        by = left_padding.prefill_masked if cache.holds_positions else left_padding.prefill_rows
        return self._run(partial(by, self, pads=pads), q, k, v, cache, *gated)  # (B, H, T, D)

    def padded_prefill_reason(self, cache) -> str | None:
        """Why this kernel cannot prefill a left-padded prompt into `cache`, or None."""
        reason = self.unsupported_input("attention_mask")
        if reason is not None:
            return reason
        if not self.shift_invariant:
            return MOVED_BY_LEFT_PADDING
        if cache.holds_positions and not self.decode_masks_padding:
            return "its decode step does not leave out a cache's padded slots"
        return None

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One new position: q, k, v (B, H, 1, D) -> (B, H, 1, D); appends it to the cache.
        `gates` (B, H, 1, n_gates): the new position's, for (and only for) a gated variant."""
        check_qkv(self.name, q, k, v)
        if q.shape[2] != 1:
            raise ValueError(f"{self.name}: decode takes one position, got seq_len {q.shape[2]}")
        self._check_fit("decode", q, k, v, cache, gates)
        gated = self._gated(q, gates)
        k, v = self._decoding_heads(q, k, v)
        return self._run(self.decode_step, q, k, v, cache, *gated)

    def _check_fit(self, call: str, q, k, v, cache, gates) -> None:
        """`ValueError` before any hook runs if q, k, v (and gates) are not what `cache` was
        built for (batch, heads, head_dim, dtype, device) or would take it past max_len: a hook
        that failed halfway would leave the cache advanced over a slot it never wrote."""
        kv_heads = k.shape[1] if self.native_gqa_decode else q.shape[1]  # else repeated to H
        misfit = cache.misfit(q, kv_heads, {"k": k, "v": v, "gates": gates})
        if misfit is not None:
            raise ValueError(f"{self.name}: {call} got {misfit}")
        if cache.length + q.shape[2] > cache.max_len:
            raise ValueError(
                f"{self.name}: cache of option 'max_len'={cache.max_len} cannot take "
                f"{cache.length + q.shape[2]} positions"
            )

    def _run(self, hook, q, k, v, cache, *gates) -> torch.Tensor:
        """hook(q, k, v, cache, *gates) without autograd, in eval mode. If it raises anyway,
        the cache's attributes are put back: its length and counters, and any tensor it
        replaced (entries written past the old length are then unused; sums or counts updated
        in place are not undone, which `_check_fit` is there to prevent)."""
        saved = dict(vars(cache))
        try:
            with torch.no_grad(), evaluating(self):
                return hook(q, k, v, cache, *gates)
        except BaseException:
            vars(cache).clear()
            vars(cache).update(saved)
            raise

    def _decoding_heads(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v as the decoding hooks take them: grouped for a `native_gqa_decode` variant,
        else repeated to q's heads; `UnsupportedCombination` where grouped heads are not
        taken."""
        if k.shape[1] == q.shape[1]:
            return k, v
        self.refuse_unsupported("n_kv_heads")
        if self.native_gqa_decode:
            return k, v
        return repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])

    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        raise NotImplementedError

    def prefill_into(self, q, k, v, cache, *gates) -> torch.Tensor:
        """The prompt's outputs, the cache filled: `prefill_attend`, then `cache_prompt`."""
        out = self.prefill_attend(q, k, v, cache, *gates)  # (B, H, T, D)
        self.cache_prompt(q, k, v, cache, *gates)
        return out

    def prefill_attend(self, q, k, v, cache, *gates, **masks) -> torch.Tensor:
        """`masks`: `attention_mask` (B, T) for a left-padded prompt (`decode_masks_padding`)."""
        return self.attend(q, k, v, *gates, **masks)

    def cache_prompt(self, q, k, v, cache, *gates) -> None:
        raise NotImplementedError

    def decode_step(self, q, k, v, cache, *gates) -> torch.Tensor:
        raise NotImplementedError

    def pattern(self, seq_len: int) -> Pattern | None:
        """The (query, key) position pairs this kernel attends at `seq_len`, as a
        `variants.patterns` predicate; None for kernels whose keys are not positions of the
        sequence (compressed, hashed or projected ones) or whose pairs depend on the inputs."""
        return None

    def supports_backward(self, device: torch.device) -> bool:
        """Whether this kernel can be trained on `device`; False where it runs forward only
        (`impl="flex"` on CPU: PyTorch's FlexAttention has no CPU backward)."""
        return True

    def kernel_path(self, device: torch.device | str, dtype: torch.dtype) -> str:
        """`fused` if this kernel's attention runs on PyTorch's fused kernels on `device` in
        `dtype` (SDPA, the fused flash/efficient ops of `flash.attend`, compiled FlexAttention),
        else `explicit` (explicit matmuls: `impl=math`, `flash.attend`'s fallback, and kernels
        without a softmax attention such as linear and performer). Records say it per job."""
        impl = getattr(self, "impl", None)
        if impl == "flex":
            return flash.FUSED if flex.COMPILE else flash.EXPLICIT  # tests run it eagerly
        if impl == "math" or self.softmax_kernels is None:
            return flash.EXPLICIT
        if self.softmax_kernels == "sdpa":  # PyTorch's SDPA: fused on CPU, on CUDA but float64
            device_type = torch.device(device).type
            cuda_fused = device_type == "cuda" and dtype != torch.float64
            return flash.FUSED if device_type == "cpu" or cuda_fused else flash.EXPLICIT
        return flash.path(device, dtype)

    def sdpa_backend(
        self, shape: tuple[int, int, int, int], device: torch.device | str, dtype: torch.dtype
    ) -> str | None:
        """Which of PyTorch's SDPA backends this kernel's attention runs on q, k, v of `shape`
        (B, H, L, D) on `device` in `dtype` (`math`, `flash`, `efficient`, `cudnn`); None
        unless it is exact attention through SDPA (`full`'s sdpa impls). Records say it per
        job (`sdpa_backend`)."""
        return None

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """Useful forward FLOPs (2 per multiply-add) of the score and value matmuls.

        Counts only query-key pairs the pattern actually scores (e.g. half for causal full
        attention), not padding or masked-out work, so that achieved FLOP/s is comparable across
        variants. Forward+backward is `FWD_BWD_FLOP_FACTOR` times this.
        """
        raise NotImplementedError

    @contextmanager
    def computing_heads(self, heads: torch.Tensor) -> Iterator[None]:
        """Within it, calls carry the layer's heads `heads` (indices, (G,)) alone, q, k, v
        (B, G, L, D): `of_heads` gives per-head weights' rows of those heads."""
        outer, self._computed_heads = self._computed_heads, heads
        try:
            yield
        finally:
            self._computed_heads = outer

    def of_heads(self, weight: torch.Tensor) -> torch.Tensor:
        """A per-head weight (H, ...) -> the rows of the heads this call computes (G, ...):
        all H outside `computing_heads`."""
        heads = self._computed_heads
        return weight if heads is None else weight[heads.to(weight.device)]

    def tie_to(self, first: Attention) -> None:
        """Share parameters with the first layer's kernel when the variant asks for it.

        The model calls this on every layer's kernel after the first (e.g. Linformer's
        `share=layerwise`); by default kernels share nothing.
        """

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


def pattern_length(seq_len: int, max_seq_len: int, causal: bool) -> int:
    """The length at which a pattern that depends on one (auto stride, random blocks) is taken
    for `seq_len` positions: max(seq_len, max_seq_len), so that for every input a model accepts
    (at most its `max_seq_len`) no output depends on how many tokens follow it (causally) or
    on what a document is packed with (segment ids), in either direction."""
    return max(seq_len, max_seq_len)


def empty_batch_output(q: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """The output of attention over a batch of no sequences: q (0, H, L, D) -> zeros of its
    shape and dtype, on the autograd graph of q and the other `inputs` (k, v, gates), whose
    gradients are then empty too. Kernels never see batch 0 (their reshapes by -1 and their
    divisions by the batch's size would fail)."""
    out = q * 0  # (0, H, L, D)
    for x in inputs:
        out = out + x.sum() * 0  # the sum of an empty tensor: 0
    return out


def norm_floor(dtype: torch.dtype) -> float:
    """The least norm a vector is divided by when made a unit vector in `dtype`:
    SHARED_QK_NORM_EPS, or the smallest normal number of `dtype` where that is larger. In
    float16 1e-12 rounds to 0, and a zero vector (padding) became 0 / 0 = NaN; float32, float64
    and bfloat16 keep SHARED_QK_NORM_EPS."""
    return max(SHARED_QK_NORM_EPS, torch.finfo(dtype).tiny)


def sample_gates(
    kernel: Attention,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """Gates drawn as a model would give them, sigmoid(N(0, 1)), for `kernel` on inputs shaped
    as q (B, H, L, D): (B, H, L, n_gates) in q's dtype and device, or None for an ungated
    kernel. What kernel-alone timing, memory and error measurements pass."""
    if not kernel.n_gates:
        return None
    shape = (*q.shape[:3], kernel.n_gates)
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    return torch.sigmoid(noise).to(device=q.device, dtype=q.dtype)


# A process-wide depth counter, not a thread-local: on CUDA the autograd engine runs backward,
# and hence the recompute, on its own device thread.
_replay_depth = 0


@contextmanager
def replaying() -> Iterator[None]:
    """Within this block, stochastic kernels reuse the random choices of their last forward.

    Reversible and checkpointed blocks recompute a forward pass during backward; LSH must hash
    into the same buckets then, or the recomputed graph differs from the one that produced the
    output and the gradients are wrong.
    """
    global _replay_depth
    _replay_depth += 1
    try:
        yield
    finally:
        _replay_depth -= 1


@contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """`module` in eval mode within the block (restored after): decoding uses learned state
    (routing's centroids, Performer's features) and never updates it."""
    was_training = module.training
    module.train(False)
    try:
        yield
    finally:
        module.train(was_training)


def is_replaying() -> bool:
    """True inside `replaying()`."""
    return _replay_depth > 0


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad `x` along `dim` up to the next multiple of `multiple` (no copy if already one)."""
    length = x.shape[dim]
    pad = -length % multiple
    if pad == 0:
        return x
    pad_spec = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, pad]
    return F.pad(x, pad_spec)


def shared_qk_keys(k: torch.Tensor) -> torch.Tensor:
    """The Reformer's shared-QK keys: sqrt(D) k / |k| over the last dim, (..., L, D) -> same.

    Norm sqrt(D), as trax's `length_normalized`, so a kernel's usual 1/sqrt(D) makes the score
    q . k_hat with k_hat the unit key, the same as the LSH kernel's. (Unit keys under 1/sqrt(D),
    as a widely used PyTorch port scores, trained to 9 % worse bits per byte than separate QK
    on `text`.) A zero vector (padding) stays zero.
    """
    return F.normalize(k, dim=-1, eps=norm_floor(k.dtype)) * math.sqrt(k.shape[-1])


def without_self(allowed: torch.Tensor, is_self: torch.Tensor) -> torch.Tensor:
    """The Reformer's shared-QK rule on a mask: no query attends to itself unless it must.

    allowed, is_self: bool, broadcastable to (..., Lq, Lk); True where a query may attend and
    where the key is the query's own position. Self stays allowed only in rows with no other
    allowed key (e.g. the first token of a causal sequence), so no row becomes empty. Under
    shared QK a query's score with itself, |q| / sqrt(D), is its row's largest, and would
    otherwise crowd out the keys the model is looking for.
    """
    others = allowed & ~is_self
    alone = ~others.any(dim=-1, keepdim=True)
    return others | (alone & is_self & allowed)


def masked_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over explicit keys, returning the output and its logsumexp.

    q: (..., Lq, D); k, v: (..., Lk, D); mask: bool, broadcastable to (..., Lq, Lk), True where a
    query may attend. Rows with no allowed key give a zero output and logsumexp -inf (never NaN),
    which is what combining partial results (LSH rounds, block pieces) needs.
    Returns out (..., Lq, D) and lse (..., Lq).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (..., Lq, 1)
    # exp(-inf - -inf) would be NaN for empty rows; a finite stand-in makes them exp(-inf) = 0.
    safe_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - safe_lse)  # (..., Lq, Lk)
    return torch.matmul(probs, v), lse.squeeze(-1)
