"""DeltaNet's chunked WY / UT form against the recurrence, position by position."""

from __future__ import annotations

import pytest
import torch

from tests.reference import (
    Gated,
    assert_grouped_equals_repeated,
    delta_rule_recurrent,
    mask_kwargs,
    padding_and_documents,
    qkv,
)
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


# --- the published layer's parts: short_conv, feature_map=silu, output_norm ------------------


def _published(**options):
    options = {"short_conv": 4, "feature_map": "silu", "output_norm": True, **options}
    torch.manual_seed(0)
    module = build_attention("deltanet", n_heads=3, head_dim=8, **options).double()
    with torch.no_grad():
        if module.norm_weight is not None:
            module.norm_weight.uniform_(0.5, 1.5)
    return module


def _conv_reference(module, q, k, v):
    """The causal depthwise convolution written out: out_t = sum_i w_i x_{t - (w - 1) + i}."""
    x = torch.cat([q, k, v], dim=-1)  # (B, H, L, 3D)
    batch, heads, length, width3 = x.shape
    weight = module.conv.weight.view(heads, width3, -1)  # (H, 3D, w): channel = h * 3D + c
    taps = weight.shape[-1]
    out = torch.zeros_like(x)
    for t in range(length):
        for i in range(taps):
            s = t - (taps - 1) + i
            if s >= 0:
                out[:, :, t] += weight[None, :, :, i] * x[:, :, s]
    return out.chunk(3, dim=-1)


def test_published_parts_equal_their_definitions_over_the_recurrence():
    q, k, v, beta = _inputs(21, seed=7)
    module = _published()
    cq, ck, cv = (torch.nn.functional.silu(t) for t in _conv_reference(module, q, k, v))
    expected = delta_rule_recurrent(cq, ck, cv, beta[..., 0])
    rms = expected.square().mean(-1, keepdim=True).add(1e-6).rsqrt()
    expected = expected * rms * module.norm_weight
    out = module(q, k, v, gates=beta)
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v, beta))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v, beta))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_published_parts_decode_as_the_forward(prompt):
    q, k, v, beta = (x.detach() for x in _inputs(14, seed=3))
    module = _published().eval()
    full = module(q, k, v, gates=beta)
    cache = module.init_cache(2, 3, 8, max_len=14, dtype=torch.float64)
    outs = [module.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], cache,
                           gates=beta[:, :, :prompt])]  # fmt: skip
    for t in range(prompt, 14):
        s = slice(t, t + 1)
        outs.append(module.decode(q[:, :, s], k[:, :, s], v[:, :, s], cache, gates=beta[:, :, s]))
    torch.testing.assert_close(torch.cat(outs, dim=2), full)


def test_published_parts_build_in_a_model_without_biases():
    config = ModelConfig(
        vocab_size=11, d_model=16, n_heads=2, depth=1, attention="deltanet",
        attention_options={"short_conv": 4, "feature_map": "silu", "output_norm": True},
        projection_bias=False,
    )  # fmt: skip
    model = TransformerLM(config)
    (layer,) = [m for m in model.modules() if isinstance(m, SelfAttention)]
    assert layer.qkv.bias is None and layer.out.bias is None and layer.gates.bias is None
    assert layer.kernel.conv.weight.shape == (3 * 16, 1, 4)
    model(torch.randint(11, (2, 9))).sum().backward()
    assert layer.kernel.conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"short_conv": -1}, "deltanet: option 'short_conv' must be a non-negative"),
        ({"feature_map": "relu"}, "deltanet: option 'feature_map' must be one of"),
        ({"output_norm": 1}, "deltanet: option 'output_norm' must be"),
        ({"short_conv": 4}, "options 'short_conv' and 'output_norm' need 'n_heads' and"),
    ],
)
def test_bad_published_part_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("deltanet", **options)


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
# (kv_heads of 4 query heads, masks, options): groups of 2 and 4, documents, the published parts
# (short_conv's per-head channels take the keys repeated)
GROUPED = [
    (2, "none", {}),
    (1, "none", {"feature_map": "silu"}),
    (2, "both", {}),
    (2, "none", {"short_conv": 4, "output_norm": True}),
]


@pytest.mark.parametrize("kv_heads, masks, options", GROUPED)
def test_grouped_heads_equal_the_kernel_on_repeated_keys(kv_heads, masks, options):
    keep, segments = padding_and_documents(batch=2, length=37, seed=6)
    given = mask_kwargs(keep if masks == "both" else None, segments if masks == "both" else None)
    torch.manual_seed(0)
    kernel = build_attention("deltanet", chunk_size=8, n_heads=4, head_dim=8, **options)
    kernel = Gated(kernel.double())
    q, _, _ = qkv(2, 4, 37, 8, seed=7)
    _, k, v = qkv(2, kv_heads, 37, 8, seed=8)
    assert_grouped_equals_repeated(kernel, q, k, v, given, params=list(kernel.parameters()))
