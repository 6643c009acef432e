"""Mamba-2 (Dao & Gu 2024, SSD) in the attention slot: a masked linear attention with a decay.

With C <-> q, B <-> k, x <-> v and M_0 = 0 (d x d per head),

    M_t = a_t M_{t-1} + k_t v_t^T,     o_t = q_t M_t  (+ D_h v_t with `d_skip`)

a_t from `gates[..., 0]` in (0, 1) per head and position (class docstring), q and k as given
(no normalisation, no scale). The kernel is the SSD block decomposition (`function.chunked_ssd`).
Options, masks (the state restarts at every document), grouped KV heads and decoding (M in
`cache.DeltaCache`; a position is M = a M + k v^T, o = q M) are `common.recurrent`'s. Mamba-2
shares B and C (k, q) over a group's heads and x (v) is per head; the contract groups k and v,
so here k and v are shared over a group and q is per head. The published block is
short_conv=4, feature_map=silu (its activation after the convolution), d_skip=true,
decay=mamba; its gate SiLU(z), its norm and Delta_t's scaling of x are not here.
"""

from __future__ import annotations

import torch
from torch import nn

from variants.attention.common.masking import repeat_kv
from variants.attention.common.recurrent import DT_INIT, RecurrentAttention
from variants.attention.mamba2.function import chunked_ssd
from variants.checks import require_bool
from variants.registry import register_attention


@register_attention
class Mamba2Attention(RecurrentAttention):
    """Mamba-2's SSD: M_t = a_t M_{t-1} + k_t v_t^T, o_t = q_t M_t, chunk-parallel.

    The decay gate g = gates[..., 0] is the layer's sigmoid of a projection x W of the token.
    `decay="mamba"` (default) maps it as Mamba-2 does,
    a_t = exp(-exp(A_h) softplus(logit(g) + dt_bias_h)) with logit(g) = x W and A_h, dt_bias_h
    learned per head, initialised as Mamba-2 (`common.recurrent.mamba_decay_init`);
    `decay="gate"` takes it as the decay, a_t = g (a g rounded to 0 read as the smallest normal
    number), about 0.5 at initialisation.
    """

    name = "mamba2"
    exact = False
    time_complexity = "O(L C d + L d^2)"
    memory_complexity = "O(L C + L d^2 / C)"
    bidirectional_reason = "the SSD is a recurrence over positions (a decayed state)"
    n_gates = 1  # a
    per_head_options = ("short_conv", "d_skip")

    def __init__(
        self,
        *,
        causal: bool = True,
        chunk_size: int = 64,
        short_conv: int = 0,
        feature_map: str = "identity",
        d_skip: bool = False,
        decay: str = "mamba",
        dt_min: float = DT_INIT[0],
        dt_max: float = DT_INIT[1],
        n_heads: int | None = None,
        head_dim: int | None = None,
    ):
        d_skip = require_bool(self.name, "d_skip", d_skip)
        super().__init__(
            causal=causal,
            chunk_size=chunk_size,
            short_conv=short_conv,
            feature_map=feature_map,
            decay=decay,
            dt_min=dt_min,
            dt_max=dt_max,
            n_heads=n_heads,
            head_dim=head_dim,
            per_head=d_skip,
        )
        self.d_skip = d_skip
        # Mamba-2's D, initialised at 1 as there: o_t += D_h v_t.
        self.skip = nn.Parameter(torch.ones(n_heads)) if self.d_skip else None

    def _prepared(self, q, k, v, gates, work):
        """q, k, v and log a (B, H, L)."""
        return q.to(work), k.to(work), v.to(work), self._log_decay(gates[..., 0].to(work))

    def _kernel(self, q, k, v, log_a):
        return chunked_ssd(q, k, v, log_a, self.chunk_size)

    def _step(self, q, k, v, state, gates):
        """M = a M + k v^T; o = q M."""
        work = state.dtype  # M: (B, H, D, D)
        a = self._log_decay(gates[..., 0].to(work)).exp()[..., None]  # (B, H, 1, 1)
        state *= a
        state += k.to(work).transpose(-1, -2) @ v.to(work)
        return q.to(work) @ state  # (B, H, 1, D)

    def _finish(self, out, v):
        """With `d_skip`, D_h v_t added (v repeated over a group's heads)."""
        if self.skip is None:
            return out
        skip = self.of_heads(self.skip).to(out.dtype)[:, None, None]  # (H, 1, 1)
        return out + skip * repeat_kv(v, out.shape[1]).to(out.dtype)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """2 x multiply-adds of the chunked form: per position, with C = min(chunk_size, L),
        C d for the causal halves of Q K^T and of its product with V, and 2 d^2 for the chunk
        states (K^T V) and the reads of the start states (Q M_0)."""
        c, d = min(self.chunk_size, seq_len), head_dim
        return int(2 * batch * heads * seq_len * (c * d + 2 * d * d))

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, chunk_size={self.chunk_size}, short_conv={self.short_conv}, "
            f"feature_map={self.feature_map}, d_skip={self.d_skip}, {self._decay_repr()}"
        )
