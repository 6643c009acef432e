"""DeltaNet (Schlag et al. 2021; Yang et al. 2024): linear attention whose state is edited.

q and k are L2-normalised per head (q / max(|q|, 1e-12)); with the state S_0 = 0 (d x d per
head),

    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,     o_t = S_t q_t

(no further scale), beta_t = `gates[..., 0]` in (0, 1) per head and position, computed by the
layer from the token. The recurrent form is the definition (and the tests' reference); this
kernel runs it chunk-parallel in the WY / UT-transform form of Yang et al. 2024. With
M = S^T (so o_t^T = q_t^T M_t) and M_0 the state at a chunk's start, within a chunk of C
positions (rows of K, V, Q; diag(beta) = B):

    T = (I + strict_lower(B K K^T))^{-1}         one triangular solve per chunk
    W = T B K,   U = T B V                       the UT transform
    U' = U - W M_0                               the chunk's corrected values
    O = Q M_0 + lower(Q K^T) U'                  (diagonal included)
    M_next = M_0 + K^T U'

Everything but the last three lines runs batched over all chunks; those run as a loop over the
L / C chunks (three small matmuls each; never a loop over positions), and the outputs are then
two batched matmuls. Time O(L C d + L d^2 + L C^2), memory O(L C + (L / C) d^2) per head.
Gradients are PyTorch's autograd through these operations (its triangular solve included).
`chunk_size` changes only the rounding, not the function. Computed in float32 at least, with
autocast off (a running state over thousands of positions in a half type loses its digits).

The published layer's parts (fla's `DeltaNet` layer), as options, each off by default:
`short_conv` = w > 0 runs a causal depthwise convolution of width w over q, k and v (per head
and channel; fla's ShortConvolution, width 4) before the delta rule; `feature_map=silu` passes
q, k and v through SiLU before q and k are L2-normalised (fla's qk_activation and its
convolution's activation); `output_norm` applies an RMSNorm with a learned scale over each
head's output (fla's o_norm). The projections' biases are the model's
(`model.projection_bias`; fla has none). They give the kernel parameters, so the layer passes
`n_heads` and `head_dim`.

Grouped KV heads (k, v with H_kv heads dividing q's H): beta is per query head, so the state,
the beta-weighted keys and values and the UT transform are per query head; the chunked form
takes k and v as they are and broadcasts them over each group's G query heads (never repeated
to H heads). With `short_conv`, whose k and v channels are per query head, they are repeated
first. The decode cache holds the state alone, per query head: a new token's k and v are
repeated (one position).

The kernel is `common.delta_rule`'s (gated_deltanet's too), the layer's parts, masks, grouped
heads and decoding `common.recurrent`'s. Decoding (`cache.DeltaCache`): the state M alone,
d x d per head (with `short_conv`, also the last w - 1 inputs of q, k, v, which the next
position's convolution reads). A new position is one delta-rule update,
M += beta k (v - k^T M)^T, and the read o = q M: O(d^2) per token whatever the context.
`prefill` runs the chunked form over the prompt and keeps its final state, the
recurrence's state after the prompt (up to rounding).
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
