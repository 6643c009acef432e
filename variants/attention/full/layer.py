"""Exact softmax attention: the reference every other variant is measured against."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from variants.attention.common import flash
from variants.attention.common.base import Attention, masked_attend, shared_qk_keys, without_self
from variants.attention.common.cache import KVCache, attend_prefix
from variants.attention.common.masking import document_mask, per_document
from variants.checks import UnsupportedCombination, require_bool, require_choice
from variants.registry import register_attention

# `impl`s that pin one SDPA backend (`torch.nn.attention.sdpa_kernel`), by the name the record's
# `sdpa_backend` column gives it. Plain `sdpa` lets PyTorch choose per call.
PINNED = {
    "sdpa_math": ("math", SDPBackend.MATH),
    "sdpa_flash": ("flash", SDPBackend.FLASH_ATTENTION),
    "sdpa_efficient": ("efficient", SDPBackend.EFFICIENT_ATTENTION),
}
if hasattr(SDPBackend, "CUDNN_ATTENTION"):  # torch >= 2.5
    PINNED["sdpa_cudnn"] = ("cudnn", SDPBackend.CUDNN_ATTENTION)
SDPA_IMPLS = ("sdpa", *PINNED)  # every impl that calls F.scaled_dot_product_attention
IMPLS = (*SDPA_IMPLS, "math")
# The names of the backends, by the number PyTorch's own dispatcher picks (`_fused_sdp_choice`).
_CHOSEN = {int(backend): name for name, backend in PINNED.values()}
if hasattr(SDPBackend, "OVERRIDEABLE"):  # a third-party backend registered with PyTorch
    _CHOSEN[int(SDPBackend.OVERRIDEABLE)] = "overrideable"
# What PyTorch says when the enabled backends cannot run the inputs: CPU, CUDA wording.
_NO_KERNEL = ("No viable backend", "No available kernel")


@register_attention
class FullAttention(Attention):
    """Exact attention via scaled_dot_product_attention (impl=math: explicit L x L scores).

    `impl=sdpa` lets PyTorch choose SDPA's backend per call; `sdpa_math`, `sdpa_flash`,
    `sdpa_efficient` (and `sdpa_cudnn`) pin one (`PINNED`), so a baseline is the same kernel on
    every machine. A pinned backend that cannot run the inputs on their device raises
    `UnsupportedCombination` naming `attention.impl`; `sdpa_backend` says which one runs.

    With `shared_qk=True` (set by a shared-QK model) the Reformer's conventions apply: keys are
    unit-normalised, k_hat = k / |k|, and a query does not attend to itself unless it has no
    other key. That takes an explicit (L, L) bool mask, so shared-QK full attention holds
    O(L^2) bytes even through SDPA.

    Masks: through SDPA (`impl=sdpa*`), `attention_mask` and `segment_ids` run each
    document's real positions as a sequence of its own (`per_document`), so SDPA keeps its
    causal path and never computes a cross-document or padded block; `impl=math` (the explicit
    ablation) folds them into one (B, 1, L, L) bool mask with the causal and shared-QK
    conditions. Both give the dense-mask result: a real query attends the real keys of its
    own document, a padded query's output is zero. Grouped KV
    heads are never repeated: SDPA's `enable_gqa`, and `impl=math` views q as (B, H_kv, G, L, D)
    against (B, H_kv, 1, L, D) keys; the decoding cache holds H_kv heads.
    """

    family = "exact"
    takes_scale = True

    name = "full"
    published_as = {"lra": "Transformer", "mad": "Transformer"}
    exact = True
    block_sparse_work = True
    time_complexity = "O(L^2 d)"
    memory_complexity = "O(L) sdpa, O(L^2) math, sdpa_math"
    supports_decode = True
    softmax_kernels = "sdpa"
    independent_heads = True
    supports_padding_mask = supports_segments = True
    native_gqa = native_gqa_decode = True
    decode_masks_padding = True  # a left-padded prompt's slots left out (`Cache.real_keys`)
    # Decoding (`decode_step`) attends through plain SDPA whatever the impl, as for impl=math:
    # one query row, where the backends differ little.

    def __init__(self, *, causal: bool = False, impl: str = "sdpa", shared_qk: bool = False):
        super().__init__(causal=causal)
        self.impl = require_choice(self.name, "impl", impl, IMPLS)
        self.shared_qk = require_bool(self.name, "shared_qk", shared_qk)

    @property
    def shift_invariant(self) -> bool:  # its pattern reads positions through i - j alone
        return True

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q (B, H, L, D); k, v (B, H_kv, L, D)
        if self.impl in SDPA_IMPLS and (attention_mask is not None or segment_ids is not None):
            # One dense (B, 1, L, L) mask cost SDPA its causal path and every block: 3.86x the
            # unmasked kernel with 25 % padding, 5.11x with 8 documents at 16K.
            return per_document(
                self.attend, q, k, v, attention_mask=attention_mask, segment_ids=segment_ids
            )
        mask = self._mask(q.shape[2], q.device, attention_mask, segment_ids)
        # mask: None, (L, L) or, with padding or documents, (B, 1, L, L) bool
        if self.shared_qk:
            k = shared_qk_keys(k)  # (B, H, L, D)
        grouped = k.shape[1] != q.shape[1]
        if self.impl in SDPA_IMPLS:
            is_causal = self.causal and mask is None
            gqa = {"enable_gqa": True} if grouped else {}  # the exact call of before otherwise
            if self.impl == "sdpa":
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, **gqa
                )
            return self._pinned(
                lambda: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=is_causal, **gqa
                ),
                (q, k, v, mask, is_causal, gqa),
            )
        # The reference path materialises the (L, L) scores on purpose: it is the ablation that
        # shows what SDPA's fused kernels save.
        if mask is None and self.causal:
            mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
        if grouped:  # query groups as a dim of their own, against one key head each
            batch, heads, length, dim = q.shape
            q = q.unflatten(1, (k.shape[1], -1))  # (B, H_kv, G, L, D)
            k, v = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, L, D)
            mask = mask if mask is None or mask.dim() == 2 else mask[:, :, None]
            out, _ = masked_attend(q, k, v, mask)  # (B, H_kv, G, L, D)
            return out.reshape(batch, heads, length, dim)
        out, _ = masked_attend(q, k, v, mask)  # (B, H, L, D)
        return out

    def sdpa_backend(
        self, shape: tuple[int, int, int, int], device: torch.device | str, dtype: torch.dtype
    ) -> str | None:
        """The SDPA backend `forward` runs on q, k, v of `shape` (B, H, L, D) without masks on
        `device` in `dtype`: `math`, `flash`, `efficient`, `cudnn` (`overrideable`: a
        third-party one); None for `impl=math`, which calls no SDPA.

        A pinned `impl` gives its own backend, or raises `UnsupportedCombination` if that
        backend cannot run such inputs here. Plain `sdpa` asks PyTorch's own dispatcher
        (`torch._fused_sdp_choice`, what `F.scaled_dot_product_attention` calls to choose) on
        empty tensors of the shape, without and with gradients: two names `<fwd>/<fwd+bwd>` if
        they differ (on CUDA, a backend may have no backward for the inputs), `auto` if this
        torch has no such function.
        """
        if self.impl not in SDPA_IMPLS:
            return None
        q, k, v = (torch.empty(shape, device=device, dtype=dtype) for _ in range(3))
        if self.shared_qk:
            k = q
        mask = self._mask(shape[2], torch.device(device))
        is_causal = self.causal and mask is None
        choose = getattr(torch, "_fused_sdp_choice", None)  # private: may go in a future torch
        if choose is None:
            return PINNED[self.impl][0] if self.impl in PINNED else "auto"
        names = []
        for grad in (False, True):
            inputs = [t.detach().requires_grad_(grad) for t in (q, k, v)]
            chosen = (
                self._pinned(
                    lambda: choose(*inputs, mask, 0.0, is_causal),  # noqa: B023 — called here
                    (*inputs, mask, is_causal, {}),
                )
                if self.impl in PINNED
                else choose(*inputs, mask, 0.0, is_causal)
            )
            names.append(_CHOSEN.get(int(chosen), str(int(chosen))))
        return names[0] if names[0] == names[1] else "/".join(names)

    def _pinned(self, call, inputs):
        """`call()` under the pinned backend alone; PyTorch's "no kernel" becomes our error
        about `inputs` (q, k, v, mask, is_causal, gqa options)."""
        try:
            with sdpa_kernel(PINNED[self.impl][1]):
                return call()
        except RuntimeError as error:  # an out-of-memory is one too: only "no kernel" is ours
            if not any(text in str(error) for text in _NO_KERNEL):
                raise
            raise self._unavailable(*inputs) from error

    def _unavailable(self, q, k, v, mask, is_causal, gqa) -> UnsupportedCombination:
        """The error for a pinned backend PyTorch cannot run on these inputs, with PyTorch's
        reasons where it gives them (CUDA warns why each backend was passed over)."""
        name, backend = PINNED[self.impl]
        reasons = []
        choose = getattr(torch, "_fused_sdp_choice", None)
        if choose is not None:  # ask again, listening: the warnings went by before the error
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(backend):
                        choose(q, k, v, mask, 0.0, is_causal, **gqa)
                except RuntimeError:
                    pass
            reasons = [" ".join(str(w.message).split()) for w in caught]
        why = f" ({'; '.join(reasons)})" if reasons else ""
        return UnsupportedCombination(
            f"{self.name}: option attention.impl={self.impl!r} pins SDPA's {name} backend, "
            f"which PyTorch cannot run on these inputs on {q.device.type} "
            f"({q.dtype}, q {tuple(q.shape)}){why}; use attention.impl=sdpa to let PyTorch "
            "choose, or another of " + ", ".join(PINNED)
        )

    # --- decoding: every key and value, read once per token by the fused kernel -------------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return KVCache(
            self.name, batch_size, n_heads, head_dim, max_len=max_len, device=device, dtype=dtype
        )

    def cache_prompt(self, q, k, v, cache: KVCache) -> None:
        cache.append(shared_qk_keys(k) if self.shared_qk else k, v)

    def decode_step(self, q, k, v, cache: KVCache) -> torch.Tensor:
        """Appends the position to the reserved buffers and attends over the (B, H, n, D) view
        of every key so far: one read of the cache, no copy. Under shared QK the query's own
        key is left out unless it is the only one."""
        self.cache_prompt(q, k, v, cache)
        keys, values = cache.keys(), cache.values()  # (B, H, n, D) views
        held = cache.length
        if self.shared_qk and cache.length > 1:
            keys, values, held = keys[:, :, :-1], values[:, :, :-1], held - 1
        real = cache.real_keys(torch.arange(held, device=keys.device))  # (B, 1, 1, n) or None
        return attend_prefix(q, keys, values, mask=real)  # (B, H, 1, D); keys of H_kv heads

    def _mask(
        self,
        length: int,
        device: torch.device,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The (L, L) shared-QK mask or, with padding or documents, the (B, 1, L, L) mask,
        True where a query may attend; None without any of them (SDPA's own causal path)."""
        masked = attention_mask is not None or segment_ids is not None
        if not (self.shared_qk or masked):
            return None
        position = torch.arange(length, device=device)
        allowed = torch.ones(length, length, dtype=torch.bool, device=device)
        if self.causal:
            allowed = allowed.tril()
        if masked:
            documents = document_mask(
                attention_mask, segment_ids, position[:, None], position[None, :]
            )  # (B, L, L)
            allowed = (allowed & documents)[:, None]  # (B, 1, L, L)
        if not self.shared_qk:
            return allowed
        is_self = position[:, None] == position[None, :]  # (L, L)
        return without_self(allowed, is_self)

    def kernel_path(self, device: torch.device | str, dtype: torch.dtype) -> str:
        # SDPA's math backend computes the L x L scores as `impl=math` does: explicit, pinned.
        if self.impl == "sdpa_math":
            return flash.EXPLICIT
        return super().kernel_path(device, dtype)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add x L x L x D; causal scores half.
        pairs = seq_len * (seq_len + 1) // 2 if self.causal else seq_len * seq_len
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return f"causal={self.causal}, impl={self.impl}, shared_qk={self.shared_qk}"
