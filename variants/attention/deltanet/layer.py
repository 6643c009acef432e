"""DeltaNet (Schlag et al. 2021; Yang et al. 2024): linear attention whose state is edited.

q and k are L2-normalised per head; with the state S_0 = 0 (d x d per head),

    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,     o_t = S_t q_t

(no further scale), beta_t = `gates[..., 0]` in (0, 1) per head and position, computed by the
layer from the token. The recurrence is the definition (and the tests' reference); the kernel
(`common.delta_rule`) runs it chunk-parallel in the WY / UT form, `chunk_size` changing only the
rounding, in float32 at least. fla's layer parts are options (`short_conv`, `feature_map`,
`output_norm`), off by default; the layer, masks, grouped KV heads and decoding (a d x d state
per head in `cache.DeltaCache`, O(d^2) per token) are `common.recurrent`'s. Causal only.

The chunked form's derivation, the layer's parts, grouped heads and decoding in full:
docs/variants/deltanet.md.
"""

from __future__ import annotations

import torch.nn.functional as F

from variants.attention.common.delta_rule import chunked_delta_rule, delta_rule_flops
from variants.attention.common.recurrent import RecurrentAttention
from variants.registry import register_attention

NORM_EPS = 1e-12


@register_attention
class DeltaNetAttention(RecurrentAttention):
    """DeltaNet: the delta rule S_t = S_{t-1}(I - beta k k^T) + beta v k^T, chunk-parallel."""

    name = "deltanet"
    published_as = {"mad": "DeltaNet"}
    exact = False
    time_complexity = "O(L C d + L d^2)"
    memory_complexity = "O(L C + L d^2 / C)"
    bidirectional_reason = (
        "the delta rule is a recurrence over positions (a state edited token by token)"
    )
    n_gates = 1
    independent_heads = True

    def __init__(
        self,
        *,
        causal: bool = True,
        chunk_size: int = 64,
        short_conv: int = 0,
        feature_map: str = "identity",
        output_norm: bool = False,
        n_heads: int | None = None,
        head_dim: int | None = None,
    ):
        super().__init__(
            causal=causal,
            chunk_size=chunk_size,
            short_conv=short_conv,
            feature_map=feature_map,
            output_norm=output_norm,
            n_heads=n_heads,
            head_dim=head_dim,
        )

    def _prepared(self, q, k, v, gates, work):
        """Unit q, k and beta (B, H, L)."""
        q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))
        return q, k, v.to(work), gates[..., 0].to(work)

    def _kernel(self, q, k, v, beta):
        return chunked_delta_rule(q, k, v, beta, self.chunk_size)

    def _step(self, q, k, v, state, gates):
        """M += beta k (v - k^T M)^T, o = q M."""
        work = state.dtype  # M: (B, H, D, D)
        q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))  # (B, H, 1, D)
        beta = gates[..., :1].to(work)  # (B, H, 1, 1)
        correction = v.to(work) - k @ state  # (v - S k)^T: (B, H, 1, D)
        state += (beta * k).transpose(-1, -2) @ correction  # beta k (v - S k)^T
        return q @ state  # (S q)^T: (B, H, 1, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """`delta_rule.delta_rule_flops`: 3 d^2 + 2.5 C d + C^2 / 6 multiply-adds a position."""
        return delta_rule_flops(batch, heads, seq_len, head_dim, self.chunk_size)

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, chunk_size={self.chunk_size}, short_conv={self.short_conv}, "
            f"feature_map={self.feature_map}, output_norm={self.output_norm}"
        )
