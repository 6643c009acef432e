"""Linear attention and the chunked causal prefix sum against dense formulas built here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    causal_mask,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
)
from variants import build_attention
from variants.attention.common import kernelized
from variants.attention.performer import layer as performer_layer


def dense_linear_attention(q, k, v, causal):
    """The paper's formula on explicit (L, L) weights phi(q_i) . phi(k_j)."""
    weights = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)  # (B, H, L, L)
    if causal:
        weights = weights * causal_mask(q.shape[2])
    return (weights @ v) / weights.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 7, 64, 150])  # 150: two chunks of 64 and a padded one
def test_equals_the_dense_formula(causal, length):
    q, k, v = qkv(2, 3, length, 8)
    out = build_attention("linear", causal=causal)(q, k, v)
    torch.testing.assert_close(out, dense_linear_attention(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_those_of_the_dense_formula(causal):
    q, k, v = qkv(1, 2, 70, 4, requires_grad=True)
    out = build_attention("linear", causal=causal)(q, k, v)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((dense_linear_attention(q, k, v, causal) * weights).sum(), (q, k, v))
    torch.testing.assert_close(got, want)


def test_causal():
    assert_causal(build_attention("linear", causal=True), length=80, t=66)


def dense_causal_product(a, b, c, reverse):
    """sum_h of (a_g . b_h) c_h over j <= i (j >= i reversed), on explicit (L, L) scores."""
    scores = a.unsqueeze(2) @ b.unsqueeze(1).transpose(-1, -2)  # (S, G_a, G_b, L, L)
    scores = scores.triu() if reverse else scores.tril()
    return (scores @ c.unsqueeze(1)).sum(dim=2)  # (S, G_a, L, F)


# (heads reading, heads summed): one sequence each, grouped queries (forward), grouped keys
PRODUCT_HEADS = [(1, 1), (3, 1), (1, 2)]


@pytest.mark.parametrize("heads", PRODUCT_HEADS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [5, 64, 200])
def test_causal_product_in_groups_of_one_chunk(reverse, length, heads, monkeypatch):
    # A 1-byte state budget makes every chunk its own group: the carry between groups counts.
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, heads[0], length, 6, generator=g, dtype=torch.float64)
    b = torch.rand(2, heads[1], length, 6, generator=g, dtype=torch.float64)
    c = torch.randn(2, heads[1], length, 5, generator=g, dtype=torch.float64)
    want = dense_causal_product(a, b, c, reverse)
    torch.testing.assert_close(kernelized.causal_product(a, b, c, reverse=reverse), want)
    monkeypatch.setattr(kernelized, "STATE_BYTES", 1)
    torch.testing.assert_close(kernelized.causal_product(a, b, c, reverse=reverse), want)


@pytest.mark.parametrize("heads", PRODUCT_HEADS)
def test_causal_product_gradcheck(heads):
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, heads[0], 70, 3, generator=g, dtype=torch.float64)
    b = torch.rand(2, heads[1], 70, 3, generator=g, dtype=torch.float64)
    c = torch.randn(2, heads[1], 70, 2, generator=g, dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (a, b, c)]
    assert torch.autograd.gradcheck(kernelized.CausalProduct.apply, inputs, fast_mode=True)


def test_causal_backward_saves_no_per_position_state():
    # Autograd may keep the features and values (L x (E + D + 1)) but nothing of L x E x D.
    q, k, v = qkv(1, 1, 4096, 32, dtype=torch.float32, requires_grad=True)
    saved = []

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        build_attention("linear", causal=True)(q, k, v)
    assert max(saved) <= 4096 * 33


def test_flops_count_building_and_reading_the_state():
    assert build_attention("linear").flops(2, 4, 1024, 64) == 4 * 2 * 4 * 1024 * 64 * 65


# --- grouped KV heads: the sums per KV head (`kernelized`, shared with performer) ------------
FEATURE_KERNELS = {"linear": {}, "performer": {"head_dim": 8, "seed": 0}}
# (kv_heads of 4 query heads, masks): groups of 2 and 4, with and without documents
GROUPED = [(2, "none"), (1, "none"), (2, "both"), (1, "segments")]


def _grouped_inputs(kv_heads, masks, length):
    """q of 4 heads, k and v of `kv_heads`, and the mask keywords `masks` names."""
    keep, segments = padding_and_documents(batch=2, length=length, seed=3)
    given = mask_kwargs(
        keep if masks == "both" else None, segments if masks in ("segments", "both") else None
    )
    q, _, _ = qkv(2, 4, length, 8, seed=4)
    _, k, v = qkv(2, kv_heads, length, 8, seed=5)
    return q, k, v, given


@pytest.mark.parametrize("kv_heads, masks", GROUPED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", FEATURE_KERNELS)
def test_grouped_heads_equal_the_kernel_on_repeated_keys(name, causal, kv_heads, masks):
    kernel = build_attention(name, causal=causal, **FEATURE_KERNELS[name]).double()
    # 150: two chunks of 64 and a padded one, so the causal carry crosses chunks
    assert_grouped_equals_repeated(kernel, *_grouped_inputs(kv_heads, masks, 150))


@pytest.mark.parametrize("causal", [False, True])
def test_performer_head_by_head_takes_grouped_heads(causal, monkeypatch):
    kernel = build_attention("performer", causal=causal, head_dim=8, seed=0).double()
    q, k, v, _ = _grouped_inputs(2, "none", 70)
    want = kernel(q, k, v)
    monkeypatch.setattr(performer_layer, "HEAD_BY_HEAD_BYTES", 0)  # one KV head at a time
    torch.testing.assert_close(kernel(q, k, v), want)
    assert_grouped_equals_repeated(kernel, q, k, v)


@pytest.mark.parametrize("name", FEATURE_KERNELS)
def test_decodes_grouped_heads_from_a_cache_of_kv_heads(name):
    kernel = build_attention(name, causal=True, **FEATURE_KERNELS[name])
    q, _, _ = qkv(2, 4, 12, 8, seed=8)
    _, k, v = qkv(2, 2, 12, 8, seed=9)
    cache = kernel.init_cache(2, 4, 8, max_len=12, dtype=q.dtype, n_kv_heads=2)
    assert cache.state.shape[1] == 2  # the sums of the KV heads only
    got = prefill_then_decode(kernel, q, k, v, cache, 5)
    torch.testing.assert_close(got, kernel(q, k, v))
