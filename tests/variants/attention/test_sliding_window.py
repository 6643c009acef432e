"""Sliding-window attention with sinks, against dense masks written from its definition."""

from __future__ import annotations

import math

import pytest
import torch

import variants
from tests.reference import dense_attention, qkv, rule_mask


def window_rule(window, sinks, causal):
    """Query i sees the `window` latest positions (|i - j| < window bidirectionally) and the
    first `sinks` positions (never a future one when causal)."""

    def rule(i, j):
        near = i - window < j <= i if causal else abs(i - j) < window
        return near or (j < sinks and (j <= i or not causal))

    return rule


def build(causal=True, **options):
    return variants.build_attention("sliding_window", causal=causal, n_heads=3, **options)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("window", "sinks", "length"), [(4, 0, 16), (5, 2, 23), (8, 3, 8), (32, 1, 20)]
)
def test_equals_dense_attention_on_the_window_and_sinks(causal, window, sinks, length):
    q, k, v = qkv(2, 3, length, 8, requires_grad=True)
    out = build(causal, window=window, sink_tokens=sinks)(q, k, v)
    mask = rule_mask(length, window_rule(window, sinks, causal))
    want = dense_attention(q, k, v, mask)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(want.sum(), (q, k, v)))


def test_learned_sink_is_a_logit_in_the_denominator_with_no_value():
    q, k, v = qkv(2, 3, 19, 8)
    kernel = build(window=6, sink_tokens=2, learned_sink=True)
    with torch.no_grad():
        kernel.sink_logit.copy_(torch.tensor([-1.0, 0.5, 2.0]))
    mask = rule_mask(19, window_rule(6, 2, True))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    sink = kernel.sink_logit.double().view(1, 3, 1, 1).expand(2, 3, 19, 1)
    probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    torch.testing.assert_close(kernel(q, k, v), probs @ v)
    kernel(q, k, v).sum().backward()
    assert kernel.sink_logit.grad.abs().min() > 0


def test_decode_cache_is_flat_in_the_context():
    kernel = build(window=8, sink_tokens=2)
    sizes = []
    cache = kernel.init_cache(1, 3, 8, max_len=200, dtype=torch.float64)
    q, k, v = qkv(1, 3, 200, 8)
    kernel.prefill(q[:, :, :10], k[:, :, :10], v[:, :, :10], cache)
    for t in range(10, 200):
        kernel.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], cache)
        sizes.append(cache.nbytes)
    assert sizes[0] == sizes[-1] == 2 * 3 * (8 + 2) * 8 * 8  # K and V of window + sinks


def test_options_are_checked():
    with pytest.raises(ValueError, match="sliding_window.*'window'"):
        build(window=0)
    with pytest.raises(ValueError, match="sliding_window.*'sink_tokens'"):
        build(sink_tokens=-1)
