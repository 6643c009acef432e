"""Performer (Choromanski et al. 2021): softmax attention estimated with FAVOR+ random features.

exp(q . k / sqrt(d)) = E_w[phi(q) . phi(k)] for phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), with
x' = x / d^(1/4) and the m rows of W Gaussian; attention becomes the normalised linear
attention of `kernelized` over these features: O(L m d) time, O(L (m + d) + m d) memory, causal
through chunked prefix sums, error shrinking as 1/sqrt(m). The features are positive and
orthogonal, m = `n_features` (default round(d ln d)), drawn once from `seed` and redrawn every
`redraw_interval` training forwards if set (never in eval or inside `base.replaying()`).
Stabilisers cancel exactly, causally with no future key entering a past output; `eps` and
`denominator_eps` keep float32 gradients finite. Grouped KV heads are taken as they are; half
types are computed in float32.

The choices where published implementations differ, and why: docs/variants/performer.md.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from variants.attention.common import kernelized
from variants.attention.common.base import Attention, is_replaying
from variants.attention.common.cache import StateCache
from variants.attention.common.masking import per_document
from variants.checks import require_non_negative_int, require_positive_int
from variants.registry import register_attention

HALF_TYPES = (torch.float16, torch.bfloat16)
# Above this many bytes of one feature map (B, H, L, m) in float32, the heads are computed one
# at a time, each under activation checkpointing when training: at 2^20 tokens, 4 heads and the
# default 266 features, a map is 4.4 GB and the attention keeps several.
HEAD_BY_HEAD_BYTES = 2**30


def default_features(head_dim: int) -> int:
    """round(d ln d), at least 1: the paper's m = d log d."""
    return max(1, round(head_dim * math.log(head_dim)))


def orthogonal_features(
    n_features: int, head_dim: int, generator: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """(n_features, head_dim) rows in blocks of head_dim mutually orthogonal rows, each of the
    length of a Gaussian vector: marginally N(0, I) rows, orthogonal within a block."""
    blocks = []
    for _ in range(-(-n_features // head_dim)):
        gaussian = torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gaussian)
        blocks.append((q * torch.sign(torch.diagonal(r))).T)  # Haar-distributed rows
    directions = torch.cat(blocks)[:n_features]  # (m, d), unit rows
    lengths = torch.randn(n_features, head_dim, generator=generator, dtype=torch.float64)
    return (directions * lengths.norm(dim=1, keepdim=True)).to(dtype)  # (m, d)


@register_attention
class PerformerAttention(Attention):
    """Performer FAVOR+: positive orthogonal random features, seeded, optionally redrawn."""

    family = "kernel"
    takes_scale = True
    knobs = ("n_features",)

    name = "performer"
    published_as = {"lra": "Performer"}
    exact = False
    time_complexity = "O(L m d)"
    memory_complexity = "O(L m + m d)"
    supports_decode = True
    independent_heads = True
    supports_padding_mask = supports_segments = True  # one document at a time
    native_gqa = native_gqa_decode = True  # key features and sums per KV head

    def __init__(
        self,
        *,
        causal: bool = False,
        n_features: int | None = None,
        seed: int | None = None,
        redraw_interval: int | None = None,
        head_dim: int = 64,
        eps: float = 1e-4,
        denominator_eps: float = 1e-6,
    ):
        super().__init__(causal=causal)
        for option, value in (("eps", eps), ("denominator_eps", denominator_eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(
                    f"{self.name}: option {option!r} must be a number >= 0, got {value!r}"
                )
        self.eps, self.denominator_eps = float(eps), float(denominator_eps)
        self.head_dim = require_positive_int(self.name, "head_dim", head_dim)
        if n_features is None:
            n_features = default_features(head_dim)
        self.n_features = require_positive_int(self.name, "n_features", n_features)
        self.seed = None if seed is None else require_non_negative_int(self.name, "seed", seed)
        if redraw_interval is not None:
            require_positive_int(self.name, "redraw_interval", redraw_interval)
        self.redraw_interval = redraw_interval
        # The features' own seed: redraw k uses base_seed + k, so runs are reproducible and
        # the global RNG is touched at most once, here.
        self.base_seed = seed if seed is not None else int(torch.randint(0, 2**62, ()).item())
        self.draws = 0  # feature draws so far
        self.training_calls = 0  # training forwards outside replays
        self.register_buffer("features", self._draw(torch.float32))  # (m, d)

    def _draw(self, dtype: torch.dtype) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.base_seed + self.draws)
        return orthogonal_features(self.n_features, self.head_dim, generator, dtype)

    def redraw(self) -> None:
        """Draw new features (the next of the kernel's seeded sequence of draws)."""
        self.draws += 1
        self.features.copy_(self._draw(self.features.dtype))

    @property
    def shift_invariant(self) -> bool:  # its pattern reads positions through i - j alone
        return True

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **masks) -> torch.Tensor:
        """With a key padding mask or segment ids (`masks`) the features' attention runs on
        each document's real positions alone (`masking.per_document`): the sums restart at
        every boundary, and the key stabiliser is the document's (one draw, one call)."""
        if q.shape[-1] != self.head_dim:
            raise ValueError(
                f"{self.name}: option 'head_dim'={self.head_dim} must equal the inputs' "
                f"head_dim {q.shape[-1]} (the random features are head_dim wide)"
            )
        if self.training and not is_replaying():
            if (
                self.redraw_interval
                and self.training_calls
                and not (self.training_calls % self.redraw_interval)
            ):
                self.redraw()
            self.training_calls += 1
        dtype = q.dtype
        if dtype in HALF_TYPES:
            q, k, v = q.float(), k.float(), v.float()
        batch, heads, length, _ = q.shape
        if masks:
            return per_document(self._features_attention, q, k, v, **masks).to(dtype)
        if heads == 1 or batch * heads * length * self.n_features * 4 <= HEAD_BY_HEAD_BYTES:
            return self._features_attention(q, k, v).to(dtype)  # (B, H, L, D)
        # One KV head at a time, with its group of query heads (under checkpointing when
        # training): the features of all heads would not fit; each head's output is the same
        # either way.
        outs = []
        group = heads // k.shape[1]
        for h in range(k.shape[1]):
            queries = q[:, h * group : (h + 1) * group]  # (B, G, L, D)
            one = (queries, k[:, h : h + 1], v[:, h : h + 1])  # and (B, 1, L, D) each
            if torch.is_grad_enabled():
                outs.append(checkpoint(self._features_attention, *one, use_reentrant=False))
            else:
                outs.append(self._features_attention(*one))
        return torch.cat(outs, dim=1).to(dtype)  # (B, H, L, D)

    def _features_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """The attention over the features, q (B, H, L, D), k and v (B, H_kv, L, D) ->
        (B, H, L, D)."""
        phi_q, phi_k, key_scale = self.feature_maps(q, k)  # (B, H, L, m), (B, H_kv, L, m)
        return kernelized.feature_attention(
            phi_q, phi_k, v, causal=self.causal, denominator_eps=self.denominator_eps * key_scale
        )

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor):
        """Positive random features of q (B, H, L, D) and k (B, H_kv, L, D) -> (B, *, L, m)
        each, up to the per-row and per-sequence constants that cancel in the attention, with
        `eps` added (docs/variants/performer.md); and the keys' scale (B, H_kv, L or 1, 1): exp
        of the largest key exponent so far (non-causal: the sequence's) less the sequence's,
        which the keys' eps and `denominator_eps` are relative to."""
        phi_q = self.query_features(q)
        exponent = self.key_exponents(k)  # (B, H_kv, L, m)
        largest = exponent.detach().amax(dim=-1, keepdim=True)  # (B, H_kv, L, 1)
        if self.causal:
            largest = largest.cummax(dim=-2).values  # the largest so far
        else:
            largest = largest.amax(dim=-2, keepdim=True)  # (B, H_kv, 1, 1)
        shift = largest[..., -1:, :]  # the sequence's largest
        key_scale = (largest - shift).exp_()
        phi_k = (exponent - shift).exp_()
        if self.eps:
            phi_k = phi_k + self.eps * key_scale
        return phi_q, phi_k, key_scale

    def query_features(self, q: torch.Tensor) -> torch.Tensor:
        """(B, H, L, D) -> (B, H, L, m), each row divided by its largest, `eps` added."""
        q_proj = (q * self.head_dim**-0.25) @ self.features.to(q.dtype).T  # (B, H, L, m)
        phi_q = (q_proj - q_proj.amax(dim=-1, keepdim=True).detach()).exp_()
        return phi_q + self.eps if self.eps else phi_q

    def key_exponents(self, k: torch.Tensor) -> torch.Tensor:
        """w_f . k' - |k'|^2 / 2 with k' = k / d^(1/4): (B, H_kv, L, D) -> (B, H_kv, L, m)."""
        k_scaled = k * self.head_dim**-0.25
        k_proj = k_scaled @ self.features.to(k.dtype).T  # (B, H_kv, L, m)
        return k_proj - k_scaled.square().sum(dim=-1, keepdim=True) / 2

    # --- decoding: the running sums, m x (D + 1) per head; features fixed (eval) ----------
    # The sums are held relative to the largest key exponent so far (`StateCache.shift`),
    # which each new position may raise: the forward's sums up to it, over its constant.
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return StateCache(
            self.name, batch_size, n_heads, self.n_features, head_dim, max_len=max_len,
            device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: StateCache) -> None:
        self._add_keys(k, v, cache)

    def decode_step(self, q, k, v, cache: StateCache) -> torch.Tensor:
        work = torch.promote_types(q.dtype, torch.float32)
        phi_q = self.query_features(q.to(work))  # (B, H, 1, m)
        self._add_keys(k, v, cache)
        # Relative to the newest key's largest so far, the cache's constant: a scale of 1.
        return cache.read(phi_q, self.denominator_eps).to(q.dtype)  # (B, H, 1, D)

    def _add_keys(self, k, v, cache: StateCache) -> None:
        """Adds T positions' k, v (B, H_kv, T, D) to the sums, as `feature_maps` features them
        after the positions already held."""
        exponent = self.key_exponents(k.to(cache.state.dtype))  # (B, H_kv, T, m)
        largest = exponent.amax(dim=-1, keepdim=True).cummax(dim=-2).values  # (B, H_kv, T, 1)
        if cache.shift is not None:
            largest = torch.maximum(largest, cache.shift)
        shift = largest[..., -1:, :]  # (B, H_kv, 1, 1)
        phi_k = (exponent - shift).exp_()
        if self.eps:
            phi_k += self.eps * (largest - shift).exp_()
        cache.add(phi_k, v, shift=shift)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """Projecting q and k onto the m features, 2 x 2 B H L d m, and the linear attention
        over them (`kernelized.feature_flops`)."""
        projections = 4 * batch * heads * seq_len * head_dim * self.n_features
        attention = kernelized.feature_flops(batch, heads, seq_len, self.n_features, head_dim)
        return projections + attention

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, n_features={self.n_features}, seed={self.seed}, "
            f"redraw_interval={self.redraw_interval}, head_dim={self.head_dim}, eps={self.eps}, "
            f"denominator_eps={self.denominator_eps}"
        )
