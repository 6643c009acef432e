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

Decoding (`cache.DeltaCache`): the state M alone, d x d per head (with `short_conv`, also the
last w - 1 inputs of q, k, v, which the next position's convolution reads). A new position is one
delta-rule update, M += beta k (v - k^T M)^T, and the read o = q M: O(d^2) per token whatever
the context. `prefill` runs the chunked form over the prompt and keeps its final state, the
recurrence's state after the prompt (up to rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common.base import Attention
from variants.attention.common.cache import DeltaCache
from variants.attention.common.masking import per_document, repeat_kv
from variants.attention.deltanet.function import chunked_delta_rule
from variants.checks import (
    require_bool,
    require_choice,
    require_non_negative_int,
    require_positive_int,
)
from variants.registry import register_attention

NORM_EPS = 1e-12
FEATURE_MAPS = ("identity", "silu")
RMS_EPS = 1e-6


@register_attention
class DeltaNetAttention(Attention):
    """DeltaNet: the delta rule S_t = S_{t-1}(I - beta k k^T) + beta v k^T, chunk-parallel."""

    family = "recurrent"
    small_options = {"chunk_size": 8}
    knobs = ("chunk_size",)

    name = "deltanet"
    exact = False
    time_complexity = "O(L C d + L d^2)"
    memory_complexity = "O(L C + L d^2 / C)"
    bidirectional_supported = False
    bidirectional_reason = (
        "the delta rule is a recurrence over positions (a state edited token by token)"
    )
    n_gates = 1
    supports_decode = True
    independent_heads = True
    supports_padding_mask = supports_segments = True  # one document at a time
    native_gqa = True  # module docstring: k, v broadcast over each group in the chunked form

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
        super().__init__(causal=causal)
        self.chunk_size = require_positive_int(self.name, "chunk_size", chunk_size)
        self.short_conv = require_non_negative_int(self.name, "short_conv", short_conv)
        self.feature_map = require_choice(self.name, "feature_map", feature_map, FEATURE_MAPS)
        self.output_norm = require_bool(self.name, "output_norm", output_norm)
        if (self.short_conv or self.output_norm) and (n_heads is None or head_dim is None):
            raise ValueError(
                f"{self.name}: options 'short_conv' and 'output_norm' need 'n_heads' and "
                "'head_dim' (their weights are per head; the model's layers pass both)"
            )
        self.conv = None
        if self.short_conv:
            channels = 3 * n_heads * head_dim  # q, k and v of every head
            self.conv = nn.Conv1d(channels, channels, self.short_conv, groups=channels, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(head_dim)) if self.output_norm else None

    @property
    def shift_invariant(self) -> bool:  # its pattern reads positions through i - j alone
        return True

    def attend(self, q, k, v, gates, **masks) -> torch.Tensor:
        """With a key padding mask or segment ids (`masks`), each document's real positions
        run as a sequence of their own (`masking.per_document`): the state (and the short
        convolution's window) restarts at every boundary and never takes a padded token in."""
        if masks:
            return per_document(self.attend, q, k, v, gates, **masks)
        if self.conv is not None and k.shape[1] != q.shape[1]:  # its channels are per head
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        q, k, v = self._inputs(q, k, v, self.convolved(q, k, v))
        return self._normed(self._chunked(q, k, v, gates)[0])

    def convolved(self, q, k, v, tail: torch.Tensor | None = None) -> torch.Tensor | None:
        """q, k, v through the causal short convolution, (B, H, L, 3D) (None without one);
        `tail`: the w - 1 earlier positions' inputs (B, H, w - 1, 3D) (None: zeros)."""
        if self.conv is None:
            return None
        batch, heads, length, head_dim = q.shape
        x = torch.cat([q, k, v], dim=-1)  # (B, H, L, 3D)
        width = self.short_conv
        if tail is None:
            tail = x.new_zeros(batch, heads, width - 1, 3 * head_dim)
        x = torch.cat([tail.to(x.dtype), x], dim=2)  # (B, H, w - 1 + L, 3D)
        channels = x.permute(0, 1, 3, 2).reshape(batch, heads * 3 * head_dim, -1)  # (B, C, T)
        weight = self.conv.weight.to(x.dtype)
        out = F.conv1d(channels, weight, groups=channels.shape[1])  # (B, C, L)
        return out.reshape(batch, heads, 3 * head_dim, length).permute(0, 1, 3, 2)

    def _inputs(self, q, k, v, convolved):
        """q, k, v after the convolution (if any) and the feature map."""
        if convolved is not None:
            q, k, v = convolved.chunk(3, dim=-1)  # (B, H, L, D) each
        if self.feature_map == "silu":
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        return q, k, v

    def _normed(self, out: torch.Tensor) -> torch.Tensor:
        """Each head's output RMS-normalised with a learned scale, with `output_norm`."""
        if self.norm_weight is None:
            return out
        work = out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
        rms = work.square().mean(dim=-1, keepdim=True).add(RMS_EPS).rsqrt()
        return (work * rms * self.norm_weight.to(work.dtype)).to(out.dtype)

    def _chunked(self, q, k, v, gates) -> tuple[torch.Tensor, torch.Tensor]:
        """The outputs (B, H, L, D) in v's dtype and the final state M (B, H, D, D) in the
        work dtype (float32 or wider); k, v may have H_kv heads (grouped KV heads)."""
        work = torch.promote_types(q.dtype, torch.float32)
        heads, kv_heads, out_dtype = q.shape[1], k.shape[1], v.dtype
        with torch.autocast(q.device.type, enabled=False):
            q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))
            v, beta = v.to(work), gates[..., 0].to(work)
            if kv_heads != heads:  # (B, H_kv, G, ...) queries over (B, H_kv, 1, ...) keys
                q, beta = (x.unflatten(1, (kv_heads, -1)) for x in (q, beta))
                k, v = k.unsqueeze(2), v.unsqueeze(2)
            out, state = chunked_delta_rule(q, k, v, beta, self.chunk_size)
        if kv_heads != heads:
            out, state = out.flatten(1, 2), state.flatten(1, 2)  # (B, H, L, D), (B, H, D, D)
        return out.to(out_dtype), state

    # --- decoding: the state M = S^T, d x d per head -----------------------------------------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return DeltaCache(
            self.name, batch_size, n_heads, head_dim, max_len=max_len, device=device, dtype=dtype
        )

    def prefill_into(self, q, k, v, cache: DeltaCache, gates) -> torch.Tensor:
        """The chunked forward over the prompt; its final state is the cache's (with a short
        convolution, also the prompt's last w - 1 inputs)."""
        cache.reserve(q.shape[2])
        convolved = self.convolved(q, k, v, cache.conv_tail)
        cache.conv_tail = self._tail(q, k, v, cache.conv_tail)
        q, k, v = self._inputs(q, k, v, convolved)
        out, state = self._chunked(q, k, v, gates)
        cache.state.copy_(state)
        return self._normed(out)

    def _tail(self, q, k, v, tail):
        """The last w - 1 positions' inputs after these (None without a convolution)."""
        if self.conv is None:
            return None
        x = torch.cat([q, k, v], dim=-1)  # (B, H, T, 3D)
        if tail is not None:
            x = torch.cat([tail.to(x.dtype), x], dim=2)
        keep = self.short_conv - 1
        if x.shape[2] < keep:
            x = F.pad(x, (0, 0, keep - x.shape[2], 0))
        return x[:, :, x.shape[2] - keep :].detach()  # (B, H, w - 1, 3D)

    def decode_step(self, q, k, v, cache: DeltaCache, gates) -> torch.Tensor:
        cache.reserve(1)
        convolved = self.convolved(q, k, v, cache.conv_tail)
        cache.conv_tail = self._tail(q, k, v, cache.conv_tail)
        q, k, v = self._inputs(q, k, v, convolved)
        work, state = cache.state.dtype, cache.state  # M: (B, H, D, D)
        with torch.autocast(q.device.type, enabled=False):
            q, k = (F.normalize(x.to(work), dim=-1, eps=NORM_EPS) for x in (q, k))  # (B, H, 1, D)
            beta = gates[..., :1].to(work)  # (B, H, 1, 1)
            correction = v.to(work) - k @ state  # (v - S k)^T: (B, H, 1, D)
            state += (beta * k).transpose(-1, -2) @ correction  # beta k (v - S k)^T
            out = q @ state  # (S q)^T: (B, H, 1, D)
        return self._normed(out.to(v.dtype))

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """2 x multiply-adds of the chunked form: per position 3 d^2 (W M_0, K^T U', Q M_0)
        and, with C = min(chunk_size, L), 2.5 C d for the triangular products (B K K^T, T B K,
        T B V, lower(Q K^T), its product with U', half each) and C^2 / 6 for the solve."""
        c, d = min(self.chunk_size, seq_len), head_dim
        per_position = 3 * d * d + 2.5 * c * d + c * c / 6
        return int(2 * batch * heads * seq_len * per_position)

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, chunk_size={self.chunk_size}, short_conv={self.short_conv}, "
            f"feature_map={self.feature_map}, output_norm={self.output_norm}"
        )
