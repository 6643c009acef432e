"""Mamba-2's SSD block decomposition against its recurrence, position by position (fp64)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import (
    assert_grouped_equals_repeated,
    assert_same_outputs_and_grads,
    each_document_alone,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
)
from variants import ModelConfig, TransformerLM, UnsupportedCombination, build_attention
from variants.layers import SelfAttention

EXACT = {"rtol": 1e-10, "atol": 1e-10}


def recurrence(q, k, v, a, return_state=False):
    """S_t = a_t S_{t-1} + k_t v_t^T (D x D), o_t = S_t^T q_t, position by position.
    q, k, v: (B, H, L, D); a: (B, H, L)."""
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, dim)
    outs = []
    for t in range(length):
        state = a[:, :, t, None, None] * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((state.transpose(-1, -2) @ q[:, :, t, :, None]).squeeze(-1))
    out = torch.stack(outs, dim=2)
    return (out, state) if return_state else out


def _inputs(length, seed=0, heads=3, a=None):
    """q, k, v (2, heads, L, 8) and gates (2, heads, L, 1) = a, fp64, with grads."""
    q, k, v = qkv(2, heads, length, 8, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    gates = torch.rand(2, heads, length, 1, generator=g, dtype=torch.float64)
    if a is not None:
        gates[..., 0] = a
    return q, k, v, gates.requires_grad_()


def _reference(q, k, v, gates):
    return recurrence(q, k, v, gates[..., 0])


@pytest.mark.parametrize(
    "length, chunk", [(1, 4), (7, 4), (37, 8), (40, 8), (33, 64), (100, 16), (129, 64)]
)
def test_ssd_equals_the_recurrence_forward_and_gradients(length, chunk):
    q, k, v, gates = _inputs(length, seed=length)
    out = build_attention("mamba2", decay="gate", chunk_size=chunk)(q, k, v, gates=gates)
    expected = _reference(q, k, v, gates)
    torch.testing.assert_close(out, expected, **EXACT)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v, gates))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v, gates))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **EXACT)


@pytest.mark.parametrize("a", [1e-6, 1e-200])
def test_strong_decay_is_exact_where_a_product_of_the_decays_would_underflow(a):
    """Over a chunk of 64 the decays' product (1e-384, 1e-12800) is 0 in float64: segment sums
    (differences of cumulative log-decays) still give each pair's own decay."""
    q, k, v, gates = _inputs(100, seed=3, a=a)
    out = build_attention("mamba2", decay="gate")(q, k, v, gates=gates)
    torch.testing.assert_close(out, _reference(q, k, v, gates), **EXACT)
    grads = torch.autograd.grad(out.sum(), (q, k, v, gates))
    assert all(torch.isfinite(g).all() for g in grads)


def test_a_gate_rounded_to_zero_forgets_everything_before_it():
    q, k, v, gates = (x.detach() for x in _inputs(20, seed=5))
    gates[:, :, 11, 0] = 0.0
    out = build_attention("mamba2", decay="gate", chunk_size=8)(q, k, v, gates=gates)
    torch.testing.assert_close(out, _reference(q, k, v, gates), **EXACT)
    alone = build_attention("mamba2", decay="gate", chunk_size=8)(
        q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], gates=gates[:, :, 11:]
    )
    torch.testing.assert_close(out[:, :, 11:], alone, **EXACT)


def test_no_decay_is_causal_linear_attention_without_a_denominator():
    q, k, v, gates = (x.detach() for x in _inputs(30, seed=6, a=1.0))
    out = build_attention("mamba2", decay="gate", chunk_size=8)(q, k, v, gates=gates)
    scores = (q @ k.transpose(-1, -2)).tril()  # (B, H, L, L)
    torch.testing.assert_close(out, scores @ v, **EXACT)


def test_chunk_size_changes_nothing_beyond_rounding():
    q, k, v, gates = (x.detach() for x in _inputs(45, seed=2))
    outs = [
        build_attention("mamba2", decay="gate", chunk_size=c)(q, k, v, gates=gates)
        for c in (1, 3, 16, 64)
    ]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-12, atol=1e-12)


def test_float32_over_many_chunks_matches_the_float64_recurrence():
    """float32, 600 positions (10 chunks) with decays down to 1e-3: each chunk's product of
    decays underflows float32; the outputs keep float32's digits."""
    q, k, v, gates = (x.detach() for x in _inputs(600, seed=4))
    gates = gates.clamp_min(1e-3)
    out = build_attention("mamba2", decay="gate")(
        *(x.float() for x in (q, k, v)), gates=gates.float()
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(q, k, v, gates), rtol=1e-4, atol=1e-4)


def test_mamba2_is_causal_only_and_needs_its_gate():
    with pytest.raises(UnsupportedCombination, match="'mamba2' does not support option causal="):
        build_attention("mamba2", causal=False)
    q, k, v, _ = _inputs(5)
    with pytest.raises(ValueError, match="mamba2: option 'gates' is required"):
        build_attention("mamba2", decay="gate")(q, k, v)
    with pytest.raises(ValueError, match=r"mamba2: option 'gates' must have shape .*1\)"):
        build_attention("mamba2", decay="gate")(q, k, v, gates=torch.rand(2, 3, 5, 2))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_size": 0}, "mamba2: option 'chunk_size' must be a positive"),
        ({"short_conv": -1}, "mamba2: option 'short_conv' must be a non-negative"),
        ({"d_skip": 1}, "mamba2: option 'd_skip' must be true or false"),
        ({"decay": "exp"}, "mamba2: option 'decay' must be one of gate, mamba"),
        ({"d_skip": True}, "options 'short_conv' and 'd_skip' need 'n_heads' and"),
        ({"short_conv": 4}, "options 'short_conv' and 'd_skip' need 'n_heads' and"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("mamba2", **options)


def test_the_layer_gives_the_decay_from_the_token_and_trains_d():
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=11, d_model=16, n_heads=2, depth=1, attention="mamba2",
        attention_options={"d_skip": True, "short_conv": 4},
    )  # fmt: skip
    model = TransformerLM(config)
    (layer,) = [m for m in model.modules() if isinstance(m, SelfAttention)]
    assert layer.gates.out_features == 2 * 1  # heads x n_gates
    assert layer.kernel.skip.shape == (2,) and bool((layer.kernel.skip == 1).all())
    model(torch.randint(11, (2, 9))).sum().backward()
    assert layer.gates.weight.grad.abs().sum() > 0 and layer.kernel.skip.grad.abs().sum() > 0


def test_flops_count_the_chunked_forms_matmuls():
    kernel = build_attention("mamba2", decay="gate", chunk_size=64)
    assert kernel.flops(1, 1, 1000, 64) == 2 * 1000 * (64 * 64 + 2 * 64 * 64)
    assert kernel.flops(1, 1, 10, 64) == 2 * 10 * (10 * 64 + 2 * 64 * 64)  # one short chunk


def test_mamba_decay_is_mamba2s_map_of_the_gate_forward_and_gradients():
    """a = exp(-exp(A_h) softplus(logit(g) + dt_bias_h)), A_h and dt_bias_h learned."""
    torch.manual_seed(0)
    module = build_attention("mamba2", chunk_size=8, decay="mamba", n_heads=3, head_dim=8).double()

    def expected(q, k, v, gates):
        logit = torch.special.logit(gates[..., 0])
        dt = torch.nn.functional.softplus(logit + module.dt_bias[:, None])
        return recurrence(q, k, v, torch.exp(-module.a_log.exp()[:, None] * dt))

    q, k, v, gates = _inputs(37, seed=11)
    torch.testing.assert_close(module(q, k, v, gates=gates), expected(q, k, v, gates), **EXACT)
    assert_same_outputs_and_grads(
        lambda q, k, v, gates: module(q, k, v, gates=gates),
        expected,
        (q, k, v, gates),
        params=[module.a_log, module.dt_bias],
    )


# --- the published block's parts: short_conv, feature_map=silu, d_skip ---------------------------


def _published(**options):
    options = {"short_conv": 4, "feature_map": "silu", "d_skip": True, "decay": "gate", **options}
    torch.manual_seed(0)
    module = build_attention("mamba2", n_heads=3, head_dim=8, **options).double()
    with torch.no_grad():
        module.skip.uniform_(0.5, 1.5)
    return module


def _expected(module, q, k, v, gates):
    """The published parts written out over the recurrence: the causal depthwise convolution
    out_t = sum_i w_i x_{t - 3 + i} (channel h * 3D + c), SiLU, the recurrence, + D_h v."""
    length = q.shape[2]
    x = torch.cat([q, k, v], dim=-1)  # (B, H, L, 3D)
    weight = module.conv.weight.view(3, 24, 4)  # (H, 3D, w)
    padded = torch.nn.functional.pad(x, (0, 0, 3, 0))
    conv = sum(weight[None, :, None, :, i] * padded[:, :, i : i + length] for i in range(4))
    cq, ck, cv = torch.nn.functional.silu(conv).chunk(3, dim=-1)
    return _reference(cq, ck, cv, gates) + module.skip[:, None, None] * cv


def test_published_parts_equal_their_definitions_over_the_recurrence():
    module = _published(chunk_size=8)
    assert_same_outputs_and_grads(
        lambda q, k, v, gates: module(q, k, v, gates=gates),
        lambda q, k, v, gates: _expected(module, q, k, v, gates),
        _inputs(21, seed=7),
        params=list(module.parameters()),
    )


def test_d_skip_alone_adds_d_times_v():
    module = build_attention(
        "mamba2", decay="gate", chunk_size=8, d_skip=True, n_heads=3, head_dim=8
    ).double()
    with torch.no_grad():
        module.skip.copy_(torch.tensor([0.5, -2.0, 3.0]))
    q, k, v, gates = (x.detach() for x in _inputs(19, seed=8))
    expected = _reference(q, k, v, gates) + module.skip[:, None, None] * v
    torch.testing.assert_close(module(q, k, v, gates=gates), expected, **EXACT)


# --- decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, kv_heads, options",
    [
        (1, 3, {}),
        (9, 3, {}),
        (13, 3, {}),
        (5, 1, {}),  # grouped KV heads: the cache per query head
        (2, 3, {"short_conv": 4, "feature_map": "silu", "d_skip": True}),
        (9, 1, {"short_conv": 3, "d_skip": True}),
        (6, 1, {"decay": "mamba", "d_skip": True}),
    ],
)
def test_prefill_and_decode_equal_the_forward(prompt, kv_heads, options):
    q, k, v, gates = (x.detach() for x in _inputs(21, seed=3))
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    torch.manual_seed(0)
    module = build_attention("mamba2", chunk_size=4, n_heads=3, head_dim=8, **options)
    module = module.double().eval()
    if module.skip is not None:
        with torch.no_grad():
            module.skip.uniform_(0.5, 1.5)
    full = module(q, k, v, gates=gates)
    cache = module.init_cache(2, 3, 8, max_len=21, dtype=torch.float64, n_kv_heads=kv_heads)
    decoded = prefill_then_decode(module, q, k, v, cache, prompt, gates)
    torch.testing.assert_close(decoded, full, **EXACT)


@pytest.mark.parametrize("prompt", [1, 8, 19])
def test_prefill_leaves_the_recurrences_state(prompt):
    q, k, v, gates = (x.detach() for x in _inputs(prompt, seed=8))
    module = build_attention("mamba2", decay="gate", chunk_size=4)
    cache = module.init_cache(2, 3, 8, max_len=32, dtype=torch.float64)
    module.prefill(q, k, v, cache, gates)
    _, state = recurrence(q, k, v, gates[..., 0], return_state=True)
    torch.testing.assert_close(cache.state, state, **EXACT)
    assert cache.length == prompt and cache.nbytes == 2 * 3 * 8 * 8 * 8


# --- masks and grouped KV heads ------------------------------------------------------------------


@pytest.mark.parametrize("masks", ["padding", "documents", "both"])
def test_masks_run_each_documents_real_positions_as_their_own_sequence(masks):
    keep, segments = padding_and_documents(batch=2, length=37, seed=6)
    keep = keep if masks != "documents" else None
    segments = segments if masks != "padding" else None
    q, k, v, gates = _inputs(37, seed=9)
    kernel = build_attention("mamba2", decay="gate", chunk_size=8)

    def reference(q, k, v, gates):
        return each_document_alone(_reference, (q, k, v, gates), keep, segments)

    assert_same_outputs_and_grads(
        lambda q, k, v, gates: kernel(q, k, v, gates=gates, **mask_kwargs(keep, segments)),
        reference,
        (q, k, v, gates),
    )


@pytest.mark.parametrize(
    "kv_heads, masks, options",
    [
        (2, False, {}),
        (1, False, {"feature_map": "silu"}),
        (2, True, {"d_skip": True, "decay": "mamba"}),
        (2, False, {"short_conv": 4, "d_skip": True}),
    ],
)
def test_grouped_heads_equal_the_kernel_on_repeated_keys(kv_heads, masks, options):
    keep, segments = padding_and_documents(batch=2, length=37, seed=6)
    given = mask_kwargs(keep, segments) if masks else {}
    torch.manual_seed(0)
    kernel = build_attention("mamba2", chunk_size=8, n_heads=4, head_dim=8, **options).double()
    gates = torch.rand(2, 4, 37, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q, _, _ = qkv(2, 4, 37, 8, seed=7)
    _, k, v = qkv(2, kv_heads, 37, 8, seed=8)

    def gated(q, k, v, **m):
        return kernel(q, k, v, gates=gates, **m)

    assert_grouped_equals_repeated(gated, q, k, v, given, params=list(kernel.parameters()))
