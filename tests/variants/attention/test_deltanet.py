"""DeltaNet's chunked WY / UT form against the recurrence, position by position."""

from __future__ import annotations

import pytest
import torch

from tests.reference import delta_rule_recurrent, qkv
from variants import ModelConfig, TransformerLM, UnsupportedCombination, build_attention
from variants.layers import SelfAttention


def _inputs(length, seed=0):
    q, k, v = qkv(2, 3, length, 8, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    beta = torch.rand(2, 3, length, 1, generator=g, dtype=torch.float64).requires_grad_()
    return q, k, v, beta


@pytest.mark.parametrize("length, chunk", [(1, 4), (7, 4), (37, 8), (40, 8), (33, 64)])
def test_chunked_form_equals_the_recurrence_forward_and_gradients(length, chunk):
    q, k, v, beta = _inputs(length, seed=length)
    out = build_attention("deltanet", chunk_size=chunk)(q, k, v, gates=beta)
    expected = delta_rule_recurrent(q, k, v, beta[..., 0])
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v, beta))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v, beta))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_chunk_size_changes_nothing_beyond_rounding():
    q, k, v, beta = (x.detach() for x in _inputs(45, seed=2))
    outs = [build_attention("deltanet", chunk_size=c)(q, k, v, gates=beta) for c in (1, 3, 16, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-12, atol=1e-12)


def test_float32_matches_the_float64_recurrence():
    q, k, v, beta = (x.detach() for x in _inputs(150, seed=4))
    out = build_attention("deltanet")(*(x.float() for x in (q, k, v)), gates=beta.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out.double(), delta_rule_recurrent(q, k, v, beta[..., 0]), rtol=1e-4, atol=1e-5
    )


def test_deltanet_is_causal_only_and_needs_its_gates():
    with pytest.raises(
        UnsupportedCombination, match="'deltanet' does not support option causal=False"
    ):
        build_attention("deltanet", causal=False)
    q, k, v, _ = _inputs(5)
    with pytest.raises(ValueError, match="deltanet: option 'gates' is required"):
        build_attention("deltanet")(q, k, v)
    with pytest.raises(ValueError, match="deltanet: option 'gates' must have shape"):
        build_attention("deltanet")(q, k, v, gates=torch.rand(2, 3, 5, 2))


def test_the_layer_gives_beta_from_the_token_through_a_sigmoid():
    torch.manual_seed(0)
    model = TransformerLM(
        ModelConfig(vocab_size=11, d_model=16, n_heads=2, depth=1, attention="deltanet")
    )
    (layer,) = [m for m in model.modules() if isinstance(m, SelfAttention)]
    assert layer.gates.out_features == 2 * 1  # heads x n_gates
    tokens = torch.randint(11, (2, 9))
    model(tokens).sum().backward()
    gate_weights = [p for n, p in model.named_parameters() if "gates" in n]
    assert gate_weights and all(p.grad is not None and p.grad.abs().sum() > 0 for p in gate_weights)
