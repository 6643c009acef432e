"""Linformer (Wang et al. 2020): keys and values projected along the sequence to k rows.

softmax(Q (E K)^T / sqrt(d)) (F V) with learned E, F in R^{k x N}, N = max_seq_len; an input of
length L < N uses the first L columns of E and F. Time O(L k d) and memory O(L k) instead of
O(L^2). Every projected key mixes all positions, future ones included, so Linformer cannot be
causal: building it with causal=True is refused, and the lengths it accepts are bounded by N.
`share` (none | headwise | kv | layerwise) shares E and F across heads, keys and values, layers.

Initialised as the paper's fairseq code (xavier-uniform, gain 1/sqrt(2)); `init=identity` and
`learn_projection=False` are probes, not the paper's (E, F start at [I; 0] / stay where they
start). Masks, grouped KV heads, sharing modes and the probes: docs/variants/linformer.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common.base import Attention
from variants.attention.common.masking import per_document, zero_padded_positions
from variants.checks import (
    UnsupportedCombination,
    require_bool,
    require_choice,
    require_positive_int,
)
from variants.registry import register_attention

SHARE_MODES = ("none", "headwise", "kv", "layerwise")
INITS = ("xavier", "identity")


def sequence_projection(
    copies: int, proj_len: int, max_seq_len: int, init: str = "xavier"
) -> nn.Parameter:
    """`copies` projections (copies, proj_len, max_seq_len): xavier-uniform with gain 1/sqrt(2)
    (`init="xavier"`), or [I; 0] (`init="identity"`: ones at (j, j), j < min(proj_len,
    max_seq_len)).

    Initialised by hand because nn.init.xavier_uniform_ would read a 3-d tensor as a conv
    weight and take the wrong fans.
    """
    if init == "identity":
        diagonal = torch.arange(min(proj_len, max_seq_len))
        weight = torch.zeros(copies, proj_len, max_seq_len)
        weight[:, diagonal, diagonal] = 1.0
        return nn.Parameter(weight)
    bound = math.sqrt(3.0 / (proj_len + max_seq_len))
    weight = torch.empty(copies, proj_len, max_seq_len).uniform_(-bound, bound)
    return nn.Parameter(weight)


@register_attention
class LinformerAttention(Attention):
    """Linformer: keys and values projected along the sequence to k rows by learned E and F.

    Masks: padded keys and values zeroed before the projection (columns stay at their absolute
    positions); each document projected as a sequence of its own (module docstring).
    """

    family = "low_rank"
    takes_scale = True
    small_options = {"k": 16}
    knobs = ("k",)

    name = "linformer"
    published_as = {"lra": "Linformer"}
    exact = False
    time_complexity = "O(L k d)"
    memory_complexity = "O(L k)"
    softmax_kernels = "sdpa"
    causal_supported = False
    supports_padding_mask = supports_segments = True  # module docstring
    native_gqa = True  # module docstring
    causal_reason = (
        "its projection along the sequence mixes future positions into every projected key, "
        "so no query can be kept from seeing the future"
    )
    decode_reason = (
        "it is not causal: each projected key mixes every position of the sequence, so a "
        "new token changes every key and no cache of earlier ones exists"
    )
    bounded_length = True

    def __init__(
        self,
        *,
        causal: bool = False,
        k: int = 256,
        share: str = "none",
        init: str = "xavier",
        learn_projection: bool = True,
        n_heads: int = 4,
        max_seq_len: int = 4096,
    ):
        super().__init__(causal=causal)
        if causal:
            raise UnsupportedCombination(
                f"{self.name}: option 'causal'=True is not supported: {self.causal_reason}"
            )
        self.proj_len = require_positive_int(self.name, "k", k)
        self.share = require_choice(self.name, "share", share, SHARE_MODES)
        self.init = require_choice(self.name, "init", init, INITS)
        self.learn_projection = require_bool(self.name, "learn_projection", learn_projection)
        self.n_heads = require_positive_int(self.name, "n_heads", n_heads)
        self._max_seq_len = require_positive_int(self.name, "max_seq_len", max_seq_len)

        copies = n_heads if share == "none" else 1
        self.key_proj = sequence_projection(copies, k, max_seq_len, init)  # E: (H or 1, k, N)
        if share in ("none", "headwise"):
            self.value_proj = sequence_projection(copies, k, max_seq_len, init)  # F: (H or 1, k, N)
        else:
            self.register_parameter("value_proj", None)  # F is E
        for proj in (self.key_proj, self.value_proj):
            if proj is not None:
                proj.requires_grad_(learn_projection)

    @property
    def max_seq_len(self) -> int:
        """Longest input: E and F have one column per position."""
        return self._max_seq_len

    def tie_to(self, first: Attention) -> None:
        """With share=layerwise, use the first layer's projection (the same nn.Parameter)."""
        if self.share != "layerwise":
            return
        if (
            not isinstance(first, LinformerAttention)
            or first.share != "layerwise"
            or first.key_proj.shape != self.key_proj.shape
        ):
            raise ValueError(
                f"{self.name}: option share='layerwise' needs the first layer to be a layerwise "
                f"linformer with the same 'k' and 'max_seq_len', got {first!r}"
            )
        self.key_proj = first.key_proj

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q (B, H, L, D), k and v (B, H_kv, L, D) -> (B, H, L, D); padded keys and values
        zeroed before the projection, each document projected as a sequence of its own (module
        docstring)."""
        if attention_mask is not None:
            # Zeroed, padded keys and values add nothing to any projected slot.
            k = zero_padded_positions(k, attention_mask)  # (B, H, L, D)
            v = zero_padded_positions(v, attention_mask)
        if segment_ids is not None:
            return per_document(self.attend, q, k, v, segment_ids=segment_ids)
        heads, length, kv_heads = q.shape[1], q.shape[2], k.shape[1]
        if self.key_proj.shape[0] not in (1, heads):
            raise ValueError(
                f"{self.name}: option 'n_heads'={self.n_heads} must equal the inputs' heads "
                f"{heads} with share='none' (one projection per head)"
            )
        # In the inputs' dtype: half inputs meet float32 parameters outside autocast.
        key_proj = self.key_proj[:, :, :length].to(k.dtype)  # (H or 1, k, L)
        value_proj = (
            key_proj if self.value_proj is None else self.value_proj[:, :, :length].to(v.dtype)
        )
        if key_proj.shape[0] == 1 or kv_heads == heads:
            keys = torch.einsum("hkl,bhld->bhkd", key_proj, k)  # (B, H_kv, k, D)
            values = torch.einsum("hkl,bhld->bhkd", value_proj, v)  # (B, H_kv, k, D)
            return F.scaled_dot_product_attention(
                q, keys, values, enable_gqa=kv_heads != heads
            )  # (B, H, L, D)
        # One projection per query head, of its KV head's keys and values (query head h on KV
        # head h // G): (H_kv, G, k, L) projections of (B, H_kv, L, D) -> (B, H, k, D)
        key_proj, value_proj = (p.unflatten(0, (kv_heads, -1)) for p in (key_proj, value_proj))
        keys = torch.einsum("hgkl,bhld->bhgkd", key_proj, k).flatten(1, 2)  # (B, H, k, D)
        values = torch.einsum("hgkl,bhld->bhgkd", value_proj, v).flatten(1, 2)  # (B, H, k, D)
        return F.scaled_dot_product_attention(q, keys, values)  # (B, H, L, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """Attention to k projected keys, 4 B H L k d, plus projecting K and V, 2 x 2 B H k L d."""
        attention = 4 * batch * heads * seq_len * self.proj_len * head_dim
        projection = 2 * 2 * batch * heads * self.proj_len * seq_len * head_dim
        return attention + projection

    def extra_repr(self) -> str:
        return (
            f"k={self.proj_len}, share={self.share}, init={self.init}, "
            f"learn_projection={self.learn_projection}, n_heads={self.n_heads}, "
            f"max_seq_len={self._max_seq_len}"
        )
