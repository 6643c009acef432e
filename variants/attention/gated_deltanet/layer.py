"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025): the delta rule with a decay.

With unit q, k (as deltanet) and S_0 = 0 (d x d per head),

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,     o_t = S_t q_t

beta_t = `gates[..., 0]` in (0, 1) per head and position, alpha_t from `gates[..., 1]` (class
docstring). The chunked form is deltanet's WY / UT form with the decay folded in
(`common.delta_rule`, as fla's chunk_gated_delta_rule): decays are exp of differences of
cumulative log-decays within a chunk, each <= 1, in float32 at least. Options, masks (the state
restarts at every document), grouped KV heads and decoding (M = S^T, d x d per head in
`cache.DeltaCache`; a position is M = alpha M, M += beta k (v - k^T M)^T, o = q M) are
deltanet's (`common.recurrent`). The published layer (fla's GatedDeltaNet) is short_conv=4,
feature_map=silu, output_norm=true, decay=mamba (the default; its output gate SiLU(x W_g) is
not here).
"""

from __future__ import annotations

import torch.nn.functional as F

from variants.attention.common.delta_rule import chunked_delta_rule, delta_rule_flops
from variants.attention.common.recurrent import DT_INIT, RecurrentAttention
from variants.registry import register_attention

NORM_EPS = 1e-12


@register_attention
class GatedDeltaNetAttention(RecurrentAttention):
    """Gated DeltaNet: S_t = alpha_t S_{t-1}(I - beta_t k k^T) + beta_t v k^T, chunk-parallel.

    The decay gate g = gates[..., 1] is the layer's sigmoid of a projection x W_a of the
    token. `decay="mamba"` (default) maps it as the paper does,
    alpha_t = exp(-exp(A_h) softplus(logit(g) + dt_bias_h)) with logit(g) = x W_a and A_h,
    dt_bias_h learned per head, initialised as Mamba-2 (`common.recurrent.mamba_decay_init`:
    alpha about 0.93 at the median, 0.47-0.99 over 5-95 %); `decay="gate"` takes it as the
    decay, alpha_t = g (a g rounded to 0 read as the smallest normal number), about 0.5 at
    initialisation: a state that forgets within a few tokens.
    """

    name = "gated_deltanet"
    exact = False
    time_complexity = "O(L C d + L d^2)"
    memory_complexity = "O(L C + L d^2 / C)"
    bidirectional_reason = (
        "the gated delta rule is a recurrence over positions (a state decayed and edited token "
        "by token)"
    )
    n_gates = 2  # beta, alpha
    per_head_options = ("short_conv", "output_norm")

    def __init__(
        self,
        *,
        causal: bool = True,
        chunk_size: int = 64,
        short_conv: int = 0,
        feature_map: str = "identity",
        output_norm: bool = False,
        decay: str = "mamba",
        dt_min: float = DT_INIT[0],
        dt_max: float = DT_INIT[1],
        n_heads: int | None = None,
        head_dim: int | None = None,
    ):
        super().__init__(
            causal=causal,
            chunk_size=chunk_size,
            short_conv=short_conv,
            feature_map=feature_map,
            output_norm=output_norm,
            decay=decay,
            dt_min=dt_min,
            dt_max=dt_max,
            n_heads=n_heads,
            head_dim=head_dim,
        )

    def _prepared(self, q, k, v, gates, work):
        """Unit q, k, beta and log alpha (B, H, L)."""
        q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))
        gates = gates.to(work)
        return q, k, v.to(work), gates[..., 0], self._log_decay(gates[..., 1])

    def _kernel(self, q, k, v, beta, log_alpha):
        return chunked_delta_rule(q, k, v, beta, self.chunk_size, log_alpha)

    def _step(self, q, k, v, state, gates):
        """M = alpha M, then deltanet's update M += beta k (v - k^T M)^T; o = q M."""
        work = state.dtype  # M: (B, H, D, D)
        q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))  # (B, H, 1, D)
        gates = gates.to(work)
        beta = gates[..., :1]  # (B, H, 1, 1)
        alpha = self._log_decay(gates[..., 1]).exp()[..., None]  # (B, H, 1, 1)
        state *= alpha
        correction = v.to(work) - k @ state  # (B, H, 1, D)
        state += (beta * k).transpose(-1, -2) @ correction
        return q @ state  # (B, H, 1, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """deltanet's (`delta_rule.delta_rule_flops`): the decay adds no matmul."""
        return delta_rule_flops(batch, heads, seq_len, head_dim, self.chunk_size)

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, chunk_size={self.chunk_size}, short_conv={self.short_conv}, "
            f"feature_map={self.feature_map}, output_norm={self.output_norm}, {self._decay_repr()}"
        )
