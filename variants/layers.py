"""The two sublayers of a transformer block: multi-head self-attention and the feed-forward.

Blocks (`variants.blocks`) wire these together; the attention kernel inside `SelfAttention` is
any registered variant, built by name through the registry.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from variants.attention.base import Attention, shared_qk_keys
from variants.checks import (
    UnsupportedCombination,
    require_bool,
    require_divisible,
    require_positive_int,
    require_probability,
)
from variants.registry import MODEL_OPTIONS, attention_spec, build_attention


class SelfAttention(nn.Module):
    """Multi-head self-attention around a registered attention kernel.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model). The kernel is
    `build_attention(attention, **attention_options, **model_options)`, where the model options
    are those of causal / n_heads / head_dim / max_seq_len / shared_qk that the variant declares.

    Shared QK (`shared_qk=True`, the Reformer's choice): one projection gives the queries, and
    the keys are derived from them so that every kernel scores q_i . k_hat_j with the unit key
    k_hat_j = q_j / |q_j| (`base.shared_qk_keys`: norm sqrt(head_dim) under the kernel's usual
    1/sqrt(head_dim)). A kernel that takes the model option `shared_qk` (full, blockwise) or
    requires it (lsh) receives k = q and applies the Reformer's whole rule itself: those keys,
    and no attending to oneself unless no other key is allowed; under shared QK a query's score
    with itself is its row's largest and would crowd out every other key. The remaining kernels
    (strided, compressed, linformer) receive the normalised keys and keep their own masks, self
    included.

    Dropout is applied to the output projection (residual dropout); kernels have no attention-
    probability dropout.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        attention: str = "full",
        attention_options: dict[str, Any] | None = None,
        causal: bool = True,
        shared_qk: bool = False,
        dropout: float = 0.0,
        max_seq_len: int = 4096,
    ):
        super().__init__()
        owner = "SelfAttention"
        require_positive_int(owner, "d_model", d_model)
        require_positive_int(owner, "n_heads", n_heads)
        require_divisible(owner, "d_model", d_model, "n_heads", n_heads)
        require_positive_int(owner, "max_seq_len", max_seq_len)
        dropout = require_probability(owner, "dropout", dropout)
        require_bool(owner, "causal", causal)
        require_bool(owner, "shared_qk", shared_qk)

        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.shared_qk = shared_qk
        self.causal = causal
        self.max_seq_len = max_seq_len
        self.kernel = self._build_kernel(attention, attention_options)
        n_projections = 2 if shared_qk else 3  # (q, v) or (q, k, v)
        self.qkv = nn.Linear(d_model, n_projections * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def replace_kernel(
        self, attention: str, attention_options: dict[str, Any] | None = None
    ) -> Attention:
        """Swap in a new kernel built as the constructor would; returns the kernel it replaces.

        The projections are kept, so a trained model can be evaluated with another kernel (the
        Reformer's Table 2: trained with full attention, evaluated with LSH). The new kernel
        takes the layer's device, dtype and train/eval mode; assigning the returned kernel to
        `kernel` restores the old one. Raises `ValueError` as the constructor does.
        """
        reference = self.out.weight
        kernel = self._build_kernel(attention, attention_options)
        kernel.to(device=reference.device, dtype=reference.dtype).train(self.training)
        previous, self.kernel = self.kernel, kernel
        return previous

    def _build_kernel(self, attention: str, attention_options: dict[str, Any] | None):
        owner = "SelfAttention"
        spec = attention_spec(attention)  # ValueError listing the variants if unknown
        if spec.shared_qk_required and not self.shared_qk:
            raise UnsupportedCombination(
                f"{owner}: attention {attention!r} requires option 'shared_qk'=True "
                f"(its keys are the normalised queries)"
            )
        attention_options = dict(attention_options or {})
        clashing = sorted(set(attention_options) & set(MODEL_OPTIONS))
        if clashing:
            raise ValueError(
                f"{owner}: attention_options may not set model option {clashing[0]!r}; "
                f"it is set by the layer"
            )
        model_options = {
            "causal": self.causal,
            "n_heads": self.n_heads,
            "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len,
            "shared_qk": self.shared_qk,
        }
        return build_attention(
            attention,
            **attention_options,
            **{k: model_options[k] for k in spec.model_options},
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        batch, length, d_model = x.shape
        q, k, v = self._queries_keys_values(self.qkv(x))  # each (B, L, d_model)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)  # each (B, H, L, head_dim)
        y = self.kernel(q, k, v)  # (B, H, L, head_dim)
        y = y.transpose(1, 2).reshape(batch, length, d_model)  # (B, L, d_model)
        return self.dropout(self.out(y))

    def _queries_keys_values(self, projected: torch.Tensor):
        # projected: (B, L, 3 d_model), or (B, L, 2 d_model) with shared QK
        d_model = self.out.in_features
        if not self.shared_qk:
            return projected.split(d_model, dim=-1)
        q, v = projected.split(d_model, dim=-1)  # (B, L, d_model) each
        if self.kernel.applies_shared_qk:
            return q, q, v
        # Normalise per head: the kernel scores head_dim-sized slices, not the whole d_model.
        q_heads = q.unflatten(-1, (self.n_heads, self.head_dim))  # (B, L, H, head_dim)
        return q, shared_qk_keys(q_heads).flatten(-2), v

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # (B, L, d_model) -> (B, H, L, head_dim)
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)


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

    def __init__(self, d_model: int, ff_mult: int = 4, dropout: float = 0.0, ff_chunks: int = 1):
        super().__init__()
        owner = "FeedForward"
        require_positive_int(owner, "d_model", d_model)
        require_positive_int(owner, "ff_mult", ff_mult)
        require_positive_int(owner, "ff_chunks", ff_chunks)
        dropout = require_probability(owner, "dropout", dropout)
        self.ff_chunks = ff_chunks
        self.net = nn.Sequential(
            nn.Linear(d_model, ff_mult * d_model),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(ff_mult * d_model, d_model),
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


def pre_norm_sublayers(
    d_model: int,
    n_heads: int,
    *,
    attention: str = "full",
    attention_options: dict[str, Any] | None = None,
    ff_mult: int = 4,
    dropout: float = 0.0,
    ff_chunks: int = 1,
    causal: bool = True,
    shared_qk: bool = False,
    max_seq_len: int = 4096,
) -> tuple[PreNorm, PreNorm]:
    """The (attention, feed-forward) sublayers every block type is made of, each pre-normed."""
    attn = SelfAttention(
        d_model,
        n_heads,
        attention=attention,
        attention_options=attention_options,
        causal=causal,
        shared_qk=shared_qk,
        dropout=dropout,
        max_seq_len=max_seq_len,
    )
    ff = FeedForward(d_model, ff_mult=ff_mult, dropout=dropout, ff_chunks=ff_chunks)
    return PreNorm(d_model, attn), PreNorm(d_model, ff)
