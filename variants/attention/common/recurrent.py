"""`RecurrentAttention`: what the d x d state kernels share (deltanet, gated_deltanet, mamba2).

A d x d state per head over the positions, run chunk-parallel by the subclass's `_kernel`
(`_prepared` maps q, k, v and the gates to its inputs, `_step` is one position of decoding).
The rest is here: the published layers' parts as options (`short_conv`: a causal depthwise
convolution of q, k, v per head and channel; `feature_map=silu`; `output_norm`: an RMSNorm with
a learned scale over each head's output; `decay`: a decay gate taken as the decay or through
Mamba-2's map), masks (each document's real positions as a sequence of its own,
`masking.per_document`), grouped KV heads (k, v broadcast over each group, never repeated, but
for the convolution's per-head channels), float32 at least with autocast off (a running state
over thousands of positions in a half type loses its digits), and decoding on
`cache.DeltaCache` (the state and, with a convolution, its last w - 1 inputs).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common.base import Attention
from variants.attention.common.cache import DeltaCache
from variants.attention.common.masking import per_document, repeat_kv
from variants.checks import (
    require_bool,
    require_choice,
    require_non_negative_int,
    require_positive_int,
    require_positive_number,
)

FEATURE_MAPS = ("identity", "silu")
RMS_EPS = 1e-6
# How a decay gate g in (0, 1) becomes the decay: "gate", alpha = g; "mamba", Mamba-2's
# alpha = exp(-exp(A_h) softplus(logit(g) + dt_bias_h)) with A_h, dt_bias_h learned per head
# (logit(g) is the layer's projection of the token, the x W of the paper).
# "mamba" is the default: the published layers' map and initialisation. With "gate" the
# initial decay is a sigmoid of a projection near 0, alpha about 0.5 (a half-life of one token),
# and neither gated_deltanet nor mamba2 learned recall (docs/variants.md).
DECAYS = ("gate", "mamba")
A_INIT = (1.0, 16.0)  # A_h ~ U(1, 16), as Mamba-2 (fla's GatedDeltaNet: U(0, 16))
DT_INIT = (1e-3, 1e-1)  # softplus(dt_bias_h) log-uniform in it, at least DT_FLOOR
DT_FLOOR = 1e-4


def mamba_decay_init(
    n_heads: int, dt_range: tuple[float, float] = DT_INIT
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's initialisation of the decay's parameters (its mamba2_simple.py; fla's
    GatedDeltaNet the same but for A's lower end): a_log = log A_h with A_h ~ U(A_INIT), and
    dt_bias_h = softplus^-1(dt_h) with dt_h log-uniform in `dt_range` (Mamba-2's dt_min,
    dt_max), floored at DT_FLOOR; (n_heads,) each, from torch's global generator. The initial
    decay is about exp(-A_h dt_h): 0.93 at the medians of the default ranges."""
    a = torch.empty(n_heads).uniform_(*A_INIT)
    low, high = (math.log(x) for x in dt_range)
    dt = torch.empty(n_heads).uniform_(low, high).exp().clamp_min(DT_FLOOR)
    return a.log(), dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)


def log_decay(gate: torch.Tensor) -> torch.Tensor:
    """log of a decay gate in (0, 1], floored at the dtype's smallest normal number: a gate that
    rounded to 0 (a sigmoid far below -87 in float32) gives a finite log, never -inf, whose
    differences within a chunk (-inf - -inf) would be NaN."""
    return gate.clamp_min(torch.finfo(gate.dtype).tiny).log()


def mamba_log_decay(gate: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """-exp(A_h) softplus(logit(g) + dt_bias_h): gate (B, H, L) in (0, 1), a_log and dt_bias
    (H,) -> (B, H, L), finite (g clamped into [tiny, 1 - eps], where a sigmoid rounds)."""
    info = torch.finfo(gate.dtype)
    gate = gate.clamp(info.tiny, 1 - info.eps)
    logit = gate.log() - torch.log1p(-gate)  # the projection x W the sigmoid was taken of
    dt = F.softplus(logit + dt_bias.to(gate.dtype)[:, None])  # (B, H, L)
    return -a_log.to(gate.dtype).exp()[:, None] * dt


def _dt_range(owner: str, dt_min: float, dt_max: float) -> tuple[float, float]:
    """(dt_min, dt_max) as floats; `ValueError` naming the option unless 0 < dt_min <= dt_max."""
    low = require_positive_number(owner, "dt_min", dt_min)
    high = require_positive_number(owner, "dt_max", dt_max)
    if low > high:
        raise ValueError(f"{owner}: option 'dt_min'={dt_min} must be <= 'dt_max'={dt_max}")
    return low, high


class RecurrentAttention(Attention):
    """A chunked state kernel with its layer's parts; subclasses give `_prepared`, `_kernel`
    and `_step` (and `_finish` for a term outside the state)."""

    family = "recurrent"
    small_options = {"chunk_size": 8}
    knobs = ("chunk_size",)
    bidirectional_supported = False
    supports_decode = True
    supports_padding_mask = supports_segments = True  # one document at a time
    native_gqa = True  # k, v broadcast over each group in the chunked form
    # Per-head weights (the convolution, A_h, dt_bias_h, D_h) are read through `of_heads`.
    independent_heads = True
    # The options whose weights are per head (they need the model's n_heads and head_dim).
    per_head_options: ClassVar[tuple[str, ...]] = ("short_conv", "output_norm")

    @property
    def shift_invariant(self) -> bool:  # a recurrence over positions: no absolute position
        return True

    def __init__(
        self,
        *,
        causal: bool,
        chunk_size: int,
        short_conv: int = 0,
        feature_map: str = "identity",
        output_norm: bool = False,
        n_heads: int | None = None,
        head_dim: int | None = None,
        decay: str | None = None,
        dt_min: float = DT_INIT[0],
        dt_max: float = DT_INIT[1],
        per_head: bool = False,
    ):
        """`decay`: how the decay gate maps to the decay (`DECAYS`; None: no decay, deltanet);
        `per_head`: a subclass's own option with weights per head is on. `decay="mamba"` has
        A_h and dt_bias_h per head given `n_heads` (a model's layer passes it), else one pair
        shared by every head (a kernel built alone); `dt_min` <= `dt_max`, both > 0: the range
        of its initial step (`mamba_decay_init`)."""
        super().__init__(causal=causal)
        self.chunk_size = require_positive_int(self.name, "chunk_size", chunk_size)
        self.short_conv = require_non_negative_int(self.name, "short_conv", short_conv)
        self.feature_map = require_choice(self.name, "feature_map", feature_map, FEATURE_MAPS)
        self.output_norm = require_bool(self.name, "output_norm", output_norm)
        self.decay = None if decay is None else require_choice(self.name, "decay", decay, DECAYS)
        if (self.short_conv or self.output_norm or per_head) and (
            n_heads is None or head_dim is None
        ):
            *first, last = (repr(o) for o in self.per_head_options)
            named = f"{', '.join(first)} and {last}"
            raise ValueError(
                f"{self.name}: options {named} need 'n_heads' and 'head_dim' (their weights are "
                "per head; the model's layers pass both)"
            )
        self.conv = None
        if self.short_conv:
            channels = 3 * n_heads * head_dim  # q, k and v of every head
            self.conv = nn.Conv1d(channels, channels, self.short_conv, groups=channels, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(head_dim)) if self.output_norm else None
        self.a_log = self.dt_bias = None
        self.dt_range = _dt_range(self.name, dt_min, dt_max)
        if self.decay == "mamba":  # per head; a kernel built alone (no n_heads): one for all
            a_log, dt_bias = mamba_decay_init(n_heads or 1, self.dt_range)
            self.a_log, self.dt_bias = nn.Parameter(a_log), nn.Parameter(dt_bias)

    def _decay_repr(self) -> str:
        """The decay's options for `extra_repr`: its initial step's range with `decay='mamba'`."""
        if self.a_log is None:
            return f"decay={self.decay}"
        return f"decay={self.decay}, dt_min={self.dt_range[0]:g}, dt_max={self.dt_range[1]:g}"

    def _log_decay(self, gate: torch.Tensor) -> torch.Tensor:
        """The log-decay of a decay gate (B, H, L) by option `decay` (`DECAYS`)."""
        if self.decay == "mamba":
            return mamba_log_decay(gate, self.of_heads(self.a_log), self.of_heads(self.dt_bias))
        return log_decay(gate)

    # --- the subclass's kernel ---------------------------------------------------------------
    def _prepared(self, q, k, v, gates, work) -> tuple:
        """q, k, v (B, H or H_kv, L, D) and gates (B, H, L, n) in dtype `work`, mapped to the
        kernel's inputs: (q, k, v, *per_query), per_query tensors (B, H, L)."""
        raise NotImplementedError

    def _kernel(self, q, k, v, *per_query) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunked form: outputs (*S, L, D) and final state M (*S, D, D); k, v broadcast
        against q (grouped KV heads: q (B, H_kv, G, L, D), k, v (B, H_kv, 1, L, D))."""
        raise NotImplementedError

    def _step(self, q, k, v, state, gates) -> torch.Tensor:
        """One position (B, H, 1, D) in the state's dtype: update `state` (B, H, D, D) in place
        and return the output (B, H, 1, D)."""
        raise NotImplementedError

    def _finish(self, out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The output after the state's read: out (B, H, L, D), v (B, H or H_kv, L, D) the
        kernel's values. By default the output norm alone."""
        return self._normed(out)

    # --- the forward --------------------------------------------------------------------------
    def attend(self, q, k, v, gates, **masks) -> torch.Tensor:
        """With a key padding mask or segment ids (`masks`), each document's real positions
        run as a sequence of their own (`masking.per_document`): the state (and the short
        convolution's window) restarts at every boundary and never takes a padded token in."""
        if masks:
            return per_document(self.attend, q, k, v, gates, **masks)
        if self.conv is not None and k.shape[1] != q.shape[1]:  # its channels are per head
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
        q, k, v = self._inputs(q, k, v, self.convolved(q, k, v))
        return self._finish(self._chunked(q, k, v, gates)[0], v)

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
        weight = self.conv.weight.unflatten(0, (-1, 3 * head_dim))  # (H, 3D, 1, w) per head
        weight = self.of_heads(weight).flatten(0, 1).to(x.dtype)  # (C, 1, w) this call's heads
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
            q, k, v, *per_query = self._prepared(q, k, v, gates, work)
            if kv_heads != heads:  # (B, H_kv, G, ...) queries over (B, H_kv, 1, ...) keys
                q, *per_query = (x.unflatten(1, (kv_heads, -1)) for x in (q, *per_query))
                k, v = k.unsqueeze(2), v.unsqueeze(2)
            out, state = self._kernel(q, k, v, *per_query)
        if kv_heads != heads:
            out, state = out.flatten(1, 2), state.flatten(1, 2)  # (B, H, L, D), (B, H, D, D)
        return out.to(out_dtype), state

    # --- decoding: the state M, d x d per head ------------------------------------------------
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
        return self._finish(out, v)

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
        with torch.autocast(q.device.type, enabled=False):
            out = self._step(q, k, v, cache.state, gates)  # (B, H, 1, D)
        return self._finish(out.to(v.dtype), v)
