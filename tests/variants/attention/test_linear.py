"""Linear attention and the chunked causal prefix sum against dense formulas built here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import assert_causal, causal_mask, qkv
from variants import build_attention
from variants.attention.common import kernelized


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


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [5, 64, 200])
def test_causal_product_in_groups_of_one_chunk(reverse, length, monkeypatch):
    # A 1-byte state budget makes every chunk its own group: the carry between groups counts.
    g = torch.Generator().manual_seed(0)
    a, b = (torch.rand(2, length, 6, generator=g, dtype=torch.float64) for _ in range(2))
    c = torch.randn(2, length, 5, generator=g, dtype=torch.float64)
    scores = a @ b.transpose(-1, -2)
    want = (scores.triu() if reverse else scores.tril()) @ c
    torch.testing.assert_close(kernelized.causal_product(a, b, c, reverse=reverse), want)
    monkeypatch.setattr(kernelized, "STATE_BYTES", 1)
    torch.testing.assert_close(kernelized.causal_product(a, b, c, reverse=reverse), want)


def test_causal_product_gradcheck():
    g = torch.Generator().manual_seed(1)
    a, b = (torch.rand(2, 70, 3, generator=g, dtype=torch.float64) for _ in range(2))
    c = torch.randn(2, 70, 2, generator=g, dtype=torch.float64)
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
