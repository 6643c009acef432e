"""The two sublayers of a transformer block: multi-head self-attention and the feed-forward.

Blocks (`variants.blocks`) wire these together; every sublayer takes the model's `ModelConfig`
(variants/model_config.py) for its sizes, and `SelfAttention` runs the kernel it is handed,
built by the model (`ModelConfig.kernel`): nothing here reads the attention options.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from variants.attention.common.base import Attention, evaluating, replaying, shared_qk_keys
from variants.attention.common.masking import left_pads, token_positions
from variants.checks import (
    check_attention_mask,
    require_divisible,
    require_positive_int,
    token_mask,
)
from variants.model_config import OWNER, ModelConfig

MULTIHEAD = "MultiheadAttention"
ROTARY_BASE = 10000.0


def rotary(x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
    """Rotary position embedding (RoFormer, Su et al. 2021), halves form as in GPT-NeoX.

    x: (B, H, L, D), D even, at positions offset .. offset + L - 1 (a decoding step's are
    after its cache's; `offset` (B,) a row's own, behind a left-padded prompt's pads; (B, L)
    each token's own, `masking.token_positions`) -> (B, H, L, D). Feature pair (i, i + D/2)
    at position p is rotated by the angle p * ROTARY_BASE^(-2i/D), so a dot product of a
    rotated query at m and a rotated key at n depends on the two positions only through
    m - n. Computed in float32 or wider.
    """
    length, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    wide = torch.promote_types(x.dtype, torch.float32)  # half types rotate in float32
    freqs = torch.exp(
        torch.arange(half, device=x.device, dtype=wide) * (-2 * math.log(ROTARY_BASE) / dim)
    )  # (D/2,)
    if isinstance(offset, torch.Tensor):  # per row or per token: (B, 1, L) positions
        positions = offset.to(wide)
        if positions.dim() == 1:
            positions = torch.arange(length, device=x.device, dtype=wide) + positions[:, None]
        positions = positions[:, None]
    else:
        positions = torch.arange(offset, offset + length, device=x.device, dtype=wide)  # (L,)
    angles = positions[..., None] * freqs  # (L, D/2) or (B, 1, L, D/2)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.to(wide)[..., :half], x.to(wide)[..., half:]  # (B, H, L, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class SelfAttention(nn.Module):
    """Multi-head self-attention around a registered attention kernel.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model). `kernel` is the one it runs, built
    for this config by the model (`config.kernel()`: the config's variant with its options and
    the model options it declares); the layer reads only the kernel's capabilities
    (`applies_shared_qk`, `n_gates`, `independent_heads`), never the attention options.

    Shared QK (`shared_qk=True`, the Reformer's choice): one projection gives the queries, and
    the keys are derived from them so that every kernel scores q_i . k_hat_j with the unit key
    k_hat_j = q_j / |q_j| (`base.shared_qk_keys`: norm sqrt(head_dim) under the kernel's usual
    1/sqrt(head_dim)). A kernel that takes the model option `shared_qk` (full, blockwise) or
    requires it (lsh) receives k = q and applies the Reformer's whole rule itself: those keys,
    and no attending to oneself unless no other key is allowed; under shared QK a query's score
    with itself is its row's largest and would crowd out every other key. The remaining kernels
    (strided, compressed, linformer) receive the normalised keys and keep their own masks, self
    included.

    Gates (a variant whose spec declares `n_gates`: NSA's branch gates, DeltaNet's beta): a
    projection of the token to (B, H, L, n_gates) and a sigmoid, passed as
    `kernel(q, k, v, gates=g)`, as the papers compute them from the layer's input.

    With `positions="rotary"` the queries and keys are rotated by their positions (`rotary`)
    before the kernel, so every kernel scores position-relative queries and keys.

    Grouped KV heads (`config.n_kv_heads`): the key and value projections have n_kv_heads
    heads each, passed to the kernel as (B, H_kv, L, head_dim) (`Attention.forward`).

    Dropout is applied to the output projection (residual dropout); kernels have no attention-
    probability dropout.

    `config.attention_chunks` > 1 (off by default), for kernels whose spec declares
    `independent_heads`: the heads are cut into that many groups (sizes differ by at most one),
    and each group's q, k, v projection, kernel and share of the output projection run under
    activation checkpointing (with the group's gates, for gated kernels), one group after
    another (a kernel's per-head weights: the group's rows, `Attention.of_heads`). Only the
    normalised input and each group's (B, L, d_model) contribution are kept
    for backward; no q, k, v of all heads and no kernel temporaries of more than one group are
    ever live. The output equals the unchunked
    layer's up to rounding (the output projection is summed over groups). The recompute runs
    inside `base.replaying()`; a performer with `redraw_interval` counts one call per group.
    Kernels without independent heads run whole.
    """

    def __init__(self, config: ModelConfig, kernel: Attention):
        super().__init__()
        self.config = config
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.kv_heads = config.kv_heads
        self.kernel = kernel
        n_projections = 2 if config.shared_qk else 3  # (q, v) or (q, k, v)
        bias = config.projection_bias
        kv_width = self.kv_heads * self.head_dim  # = d_model without grouped KV heads
        width = config.d_model + (n_projections - 1) * kv_width
        self.qkv = nn.Linear(config.d_model, width, bias=bias)
        self.out = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.dropout = nn.Dropout(config.dropout)
        self.n_gates = n_gates = kernel.n_gates  # what the gate projection is sized for
        self.gates = (
            nn.Linear(config.d_model, config.n_heads * n_gates, bias=bias) if n_gates else None
        )
        self.head_groups = min(config.attention_chunks, config.n_heads)

    def as_replacement(self, kernel: Attention) -> Attention:
        """`kernel`, built for this layer's config (`ModelConfig.kernel`) to replace the layer's
        own, on the device and dtype of the layer's weights and in its train/eval mode: a
        trained model can then be evaluated with another kernel
        (`TransformerLM.kernels_replaced`). `ValueError` unless it takes as many gates per token
        as the layer projects."""
        if kernel.n_gates != self.n_gates:
            raise ValueError(
                f"{OWNER}: attention {kernel.name!r} takes {kernel.n_gates} gates per token, this "
                f"layer was built with {self.n_gates} (option 'n_gates')"
            )
        reference = self.out.weight
        return kernel.to(device=reference.device, dtype=reference.dtype).train(self.training)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model).

        attention_mask (B, L) bool or 0/1, True = a real token (Hugging Face's and SDPA's
        convention; PyTorch's `key_padding_mask`, True = padding, is refused by name), and
        segment_ids (B, L) int document
        ids of packed sequences: handed to the kernel (`Attention.forward`), which refuses
        them with `UnsupportedCombination` where its spec does not support them. Padded
        tokens are read as zeros: whatever x holds there (NaN) reaches no real output and no
        gradient. A NaN in a real token reaches its sequence's outputs, causally earlier ones too
        (0 * NaN in masked products, as in PyTorch's SDPA), never another sequence's."""
        self._check_input(x)
        if attention_mask is not None or key_padding_mask is not None:
            attention_mask = token_mask(self.kernel.name, attention_mask, key_padding_mask)
        masks = _masks(attention_mask, segment_ids)
        if attention_mask is not None:
            check_attention_mask(self.kernel.name, attention_mask, x[:, None])
            # The kernel reads padded q, k, v as zeros, but the projections' weight gradients
            # sum x over every position, and 0 * NaN is NaN: padded tokens must hold zeros
            # from the start. Real outputs and gradients are those of any finite padding.
            x = x.masked_fill(~attention_mask[..., None], 0.0)
        # Rotary positions only: nothing else reads them, so a masked step without them pays
        # nothing for counting positions.
        rotated = self.config.positions == "rotary"
        offset = self._offset(attention_mask, segment_ids) if rotated else 0
        if self.head_groups > 1 and self.kernel.independent_heads:
            return self.dropout(self._by_head_groups(x, masks, offset))
        batch, length, d_model = x.shape
        q, k, v = self._queries_keys_values(self.qkv(x))  # (B, L, d_model), k, v (B, L, kv)
        kv_heads = self.kv_heads
        q, k, v = self._heads(q), self._heads(k, kv_heads), self._heads(v, kv_heads)
        # q (B, H, L, head_dim); k, v (B, H_kv, L, head_dim)
        if rotated:
            # Rotated after the shared-QK keys are derived: a rotation keeps norms, so the keys
            # stay the unit keys of the rotated queries, and k = q stays k = q.
            q, k = rotary(q, offset), rotary(k, offset)
        gates = None
        if self.gates is not None:
            gates = torch.sigmoid(self._heads(self.gates(x)))  # (B, H, L, n_gates)
        y = self.kernel(q, k, v, gates=gates, **masks)  # (B, H, L, head_dim)
        y = y.transpose(1, 2).reshape(batch, length, d_model)  # (B, L, d_model)
        return self.dropout(self.out(y))

    def _check_input(self, x: torch.Tensor) -> None:
        """`ValueError` naming the constraint unless x is (batch, seq_len, d_model) in the
        parameters' dtype (any dtype under autocast, which casts it): a mismatch would
        otherwise fail deep in a projection or a kernel."""
        owner, d_model = type(self).__name__, self.config.d_model
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"{owner}: input 'x' must have shape (batch, seq_len, d_model) with option "
                f"'d_model'={d_model}, got {got}"
            )
        dtype = self.out.weight.dtype
        if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(
                f"{owner}: input 'x' is {x.dtype}, the layer's parameters {dtype}: give x "
                "their dtype, or the layer x's (`.to(dtype)`), or run under torch.autocast"
            )

    # --- decoding: the kernel's cache API on (B, T, d_model) inputs --------------------------
    def init_cache(
        self,
        batch_size: int,
        *,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        """An empty decoding cache of this layer's kernel for up to `max_len` positions, on the
        device and dtype of the layer's weights unless given; raises as `Attention.init_cache`
        (a kernel that cannot decode, a bidirectional layer)."""
        weight = self.out.weight
        return self.kernel.init_cache(
            batch_size,
            self.n_heads,
            self.head_dim,
            max_len=max_len,
            device=weight.device if device is None else device,
            dtype=weight.dtype if dtype is None else dtype,
            n_kv_heads=self.kv_heads,
        )

    def prefill(
        self, x: torch.Tensor, cache, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The layer over a prompt, x (B, T, d_model) -> (B, T, d_model) as the causal forward,
        leaving the empty `cache` (`init_cache`) as if the prompt had been decoded.
        `attention_mask` (B, T), True = a real token: a left-padded prompt, each row then its
        real tokens alone (rotary positions counted from its first; `Attention.prefill`)."""
        if cache.length:
            raise ValueError(
                f"{type(self).__name__}: prefill needs an empty cache, it holds {cache.length}"
            )
        return self._cached(x, cache, attention_mask)

    def decode(self, x: torch.Tensor, cache) -> torch.Tensor:
        """The T positions after the cache's, x (B, T, d_model) -> (B, T, d_model), decoded one
        at a time (each appended to `cache`)."""
        if not cache.length:
            raise ValueError(
                f"{type(self).__name__}: decode needs a prefilled cache; prefill the prompt first"
            )
        return self._cached(x, cache)

    def _cached(self, x: torch.Tensor, cache, attention_mask=None) -> torch.Tensor:
        """The layer with its kernel bound to `cache` (and a prompt's `attention_mask`),
        without autograd and in eval mode."""
        bound = CachedKernel(self.kernel, cache, attention_mask)
        with torch.no_grad(), evaluating(self), kernels_swapped([self], [bound]):
            return self(x)

    def _offset(self, attention_mask=None, segment_ids=None) -> int | torch.Tensor:
        """Where x's positions start: 0; given masks, each token's own (B, L), counted in its
        row's or document's real tokens (`masking.token_positions`: a row as if alone); when
        the kernel is bound to a cache the cache's (`CachedKernel.offset`, per row (B,) behind
        a left-padded prompt)."""
        if isinstance(self.kernel, CachedKernel):
            return self.kernel.offset()
        positions = token_positions(attention_mask, segment_ids)
        return 0 if positions is None else positions

    def _by_head_groups(
        self, x: torch.Tensor, masks: Mapping[str, torch.Tensor], offset: int | torch.Tensor
    ) -> torch.Tensor:
        """The attention before dropout, one group of heads at a time under checkpointing:
        x (B, L, d_model) -> (B, L, d_model); `masks` as the kernel takes them, `offset` the
        rotary positions (`_offset`)."""
        heads = torch.arange(self.n_heads, device=x.device)
        out = None
        for group in torch.tensor_split(heads, self.head_groups):
            if torch.is_grad_enabled():
                part = checkpoint(
                    self._head_group,
                    x,
                    group,
                    masks,
                    offset,
                    use_reentrant=False,
                    context_fn=_replay_on_recompute,
                )
            else:
                part = self._head_group(x, group, masks, offset)
            out = part if out is None else out + part  # (B, L, d_model)
        return out if self.out.bias is None else out + self.out.bias

    def _head_group(
        self,
        x: torch.Tensor,
        group: torch.Tensor,
        masks: Mapping[str, torch.Tensor],
        offset: int | torch.Tensor,
    ) -> torch.Tensor:
        """Heads `group` (indices): their projection, kernel and share of the output
        projection (without its bias), x (B, L, d_model) -> (B, L, d_model)."""
        batch, length, d_model = x.shape
        n_projections = self.qkv.out_features // d_model
        columns = group[:, None] * self.head_dim + torch.arange(self.head_dim, device=x.device)
        columns = columns.flatten()  # (G*head_dim,) the group's features within d_model
        rows = torch.cat([columns + p * d_model for p in range(n_projections)])
        projected = F.linear(x, self.qkv.weight[rows], _rows(self.qkv.bias, rows))  # (B, L, P*G*hd)
        q, k, v = self._queries_keys_values(projected, len(group))  # each (B, L, G*head_dim)
        q, k, v = (self._heads(x, len(group)) for x in (q, k, v))  # each (B, G, L, head_dim)
        if self.config.positions == "rotary":
            q, k = rotary(q, offset), rotary(k, offset)  # as in `forward`
        gates = None
        if self.gates is not None:  # head h's gates are rows h n_gates ... of the projection
            n_gates = self.n_gates
            gate_rows = (
                group[:, None] * n_gates + torch.arange(n_gates, device=x.device)
            ).flatten()
            gated = F.linear(x, self.gates.weight[gate_rows], _rows(self.gates.bias, gate_rows))
            gates = torch.sigmoid(self._heads(gated, len(group)))  # (B, G, L, n_gates)
        with self.kernel.computing_heads(group):  # its per-head weights: the group's rows
            y = self.kernel(q, k, v, gates=gates, **masks)  # (B, G, L, head_dim)
        y = y.transpose(1, 2).reshape(batch, length, -1)  # (B, L, G*head_dim)
        return F.linear(y, self.out.weight[:, columns])  # (B, L, d_model)

    def _queries_keys_values(self, projected: torch.Tensor, n_heads: int | None = None):
        # projected: (B, L, 3 width), or (B, L, 2 width) with shared QK; width = n_heads
        # head_dim (all heads unless a group's)
        n_heads = self.n_heads if n_heads is None else n_heads
        d_model = n_heads * self.head_dim
        if not self.config.shared_qk:
            if n_heads == self.n_heads and self.kv_heads != n_heads:  # grouped KV heads
                kv_width = self.kv_heads * self.head_dim
                return projected.split([d_model, kv_width, kv_width], dim=-1)
            return projected.split(d_model, dim=-1)
        q, v = projected.split(d_model, dim=-1)  # (B, L, d_model) each
        if self.kernel.applies_shared_qk:
            return q, q, v
        # Normalise per head: the kernel scores head_dim-sized slices, not the whole d_model.
        q_heads = q.unflatten(-1, (n_heads, self.head_dim))  # (B, L, H, head_dim)
        return q, shared_qk_keys(q_heads).flatten(-2), v

    def _heads(self, x: torch.Tensor, n_heads: int | None = None) -> torch.Tensor:
        # (B, L, H * E) -> (B, H, L, E), H all heads or `n_heads` (a group's)
        return x.unflatten(-1, (n_heads or self.n_heads, -1)).transpose(1, 2)


class MultiheadAttention(SelfAttention):
    """Multi-head self-attention on any registered variant, for use in a model of one's own:
    `SelfAttention` built from its sizes instead of a whole `ModelConfig`.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model), with optional `attention_mask`
    (B, L) bool (True = a real token) and `segment_ids` (B, L) document ids. It owns its q, k,
    v and output projections (k and v to `n_kv_heads` heads, default `n_heads`) and, for a
    gated variant (NSA, DeltaNet), the projection of the token to its gates; `options` are the
    kernel's own (`variants.attention_spec(attention).options`, e.g. DeltaNet's
    `short_conv`). `positions="rotary"` rotates q and k by their positions (RoPE; in decoding
    after the cache's); by default none are added here. Decoding:
    `init_cache(batch_size, max_len=...)`, `prefill(x, cache)`, `decode(x, cache)`.

    - `shared_qk`: None is what the variant requires (True for LSH and routing).
    - `bias`: biases in the projections (the published DeltaNet layer has none).
    - `dropout`: on the output (kernels have no attention dropout).
    - `max_seq_len`: the longest sequence, a hard limit only for Linformer.

    Errors are `ValueError`s naming the option: an unknown variant lists the variants, an
    unknown option the variant's options.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        attention: str = "lsh",
        n_kv_heads: int | None = None,
        causal: bool = True,
        *,
        shared_qk: bool | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        max_seq_len: int = 4096,
        positions: str | None = None,
        **options: Any,
    ):
        require_positive_int(MULTIHEAD, "d_model", d_model)
        require_positive_int(MULTIHEAD, "n_heads", n_heads)
        require_divisible(MULTIHEAD, "d_model", d_model, "n_heads", n_heads)
        if n_kv_heads is not None:
            require_positive_int(MULTIHEAD, "n_kv_heads", n_kv_heads)
            require_divisible(MULTIHEAD, "n_heads", n_heads, "n_kv_heads", n_kv_heads)
        config = ModelConfig(
            d_model=d_model,
            n_heads=n_heads,
            attention=attention,
            attention_options=options,
            causal=causal,
            shared_qk=shared_qk,
            projection_bias=bias,
            dropout=dropout,
            max_seq_len=max_seq_len,
            n_kv_heads=n_kv_heads,
            # The layer adds no absolute positions: "sinusoidal" is the model's embedding's.
            positions="sinusoidal" if positions is None else positions,
        )
        if positions == "sinusoidal":
            raise ValueError(
                f"{MULTIHEAD}: option 'positions' is None (the caller's) or 'rotary'; "
                "sinusoidal positions belong to the embedding"
            )
        super().__init__(config, config.kernel())


class CachedKernel(nn.Module):
    """A layer's kernel bound to its decoding cache: q, k, v (B, H, T, D) of the next T
    positions -> (B, H, T, D); the prompt (empty cache) by `prefill`, with `attention_mask`
    (B, T) if it is left-padded, then one position at a time by `decode`."""

    def __init__(self, kernel: Attention, cache, attention_mask: torch.Tensor | None = None):
        super().__init__()
        self.inner = kernel
        self.cache = cache
        self.attention_mask = attention_mask

    def offset(self) -> int | torch.Tensor:
        """The position of the next token in each row's own sequence: the cache's length, less
        a row's left pads ((B,) int64 once a padded prompt is in or about to go in)."""
        if self.cache.length:
            pads = self.cache.pads
        else:
            mask = token_mask(self.inner.name, self.attention_mask, None)
            pads = left_pads(self.inner.name, mask)
        return self.cache.length if pads is None else self.cache.length - pads

    @property
    def applies_shared_qk(self) -> bool:  # the layer asks its kernel (`SelfAttention`)
        return self.inner.applies_shared_qk

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor | None = None
    ) -> torch.Tensor:
        """gates (B, H, T, n_gates): a gated kernel's, from the positions' tokens (the layer
        computes them), handed to `prefill` and `decode` with their positions."""
        if self.cache.length == 0:
            return self.inner.prefill(
                q, k, v, self.cache, gates, attention_mask=self.attention_mask
            )
        pieces = []
        for t in range(q.shape[2]):
            at = slice(t, t + 1)
            gate = None if gates is None else gates[:, :, at]  # (B, H, 1, n_gates)
            pieces.append(
                self.inner.decode(q[:, :, at], k[:, :, at], v[:, :, at], self.cache, gate)
            )
        return torch.cat(pieces, dim=2)  # (B, H, T, D)


def _rows(bias: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """A projection's bias at `rows` (a group's features), None without biases
    (`projection_bias=False`)."""
    return None if bias is None else bias[rows]


def _masks(
    attention_mask: torch.Tensor | None, segment_ids: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """The masks a layer was given, as the kernel's keyword arguments (only those given)."""
    given = {"attention_mask": attention_mask, "segment_ids": segment_ids}
    return {name: mask for name, mask in given.items() if mask is not None}


@contextlib.contextmanager
def kernels_swapped(
    layers: Sequence[SelfAttention], kernels: Sequence[nn.Module]
) -> Iterator[None]:
    """Within the block, `layers[i]` runs `kernels[i]`; each layer's own kernel comes back on
    leaving it, also on an error (kernel swaps, cached decoding)."""
    originals = [layer.kernel for layer in layers]
    for layer, kernel in zip(layers, kernels, strict=True):
        layer.kernel = kernel
    try:
        yield
    finally:
        for layer, kernel in zip(layers, originals, strict=True):
            layer.kernel = kernel


def _replay_on_recompute():
    """Checkpoint contexts: none around the forward, `base.replaying()` around its recompute
    (stochastic kernels reuse their forward's choices)."""
    return contextlib.nullcontext(), replaying()


class FeedForward(nn.Module):
    """Position-wise feed-forward: Linear(d, ff_mult*d), GELU, dropout, Linear(ff_mult*d, d).

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model). With `ff_chunks` > 1 the sequence
    is cut into `ff_chunks` pieces (sizes differ by at most one; fewer pieces if seq_len is
    shorter) that are processed one after another. The FF is position-wise, so the result is
    exactly that of the unchunked FF.

    Chunking alone would only save memory in forward: autograd keeps every chunk's
    (seq_len/ff_chunks, ff_mult*d) hidden activations for backward, which together are the whole
    unchunked hidden layer. So each chunk runs under activation checkpointing: only the chunk's
    input is kept, its hidden layer is recomputed during backward, and at most one chunk's hidden
    activations are live at a time, in forward and in backward. The price is one extra FF
    forward per step. Checkpointing restores the RNG state, so dropout masks are replayed.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        d_model, hidden = config.d_model, config.ff_mult * config.d_model
        self.ff_chunks = config.ff_chunks
        self.net = nn.Sequential(
            nn.Linear(d_model, hidden),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(hidden, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        if self.ff_chunks == 1:
            return self.net(x)
        n_pieces = min(self.ff_chunks, x.shape[1])
        pieces = torch.tensor_split(x, n_pieces, dim=1)  # n_pieces x (B, ~L/n_pieces, d_model)
        # The loop is the point: pieces run one at a time so only one hidden layer is live.
        if torch.is_grad_enabled():
            outs = [checkpoint(self.net, piece, use_reentrant=False) for piece in pieces]
        else:
            outs = [self.net(piece) for piece in pieces]
        return torch.cat(outs, dim=1)  # (B, L, d_model)


class PreNorm(nn.Module):
    """fn(LayerNorm(x)): a sublayer as the pre-norm blocks apply it."""

    def __init__(self, d_model: int, fn: nn.Module):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        return self.fn(self.norm(x))


def pre_norm_sublayers(config: ModelConfig, kernel: Attention) -> tuple[PreNorm, PreNorm]:
    """The (attention, feed-forward) sublayers every block type is made of, each pre-normed;
    the attention runs `kernel`, built for `config` (`config.kernel()`)."""
    return PreNorm(config.d_model, SelfAttention(config, kernel)), PreNorm(
        config.d_model, FeedForward(config)
    )
