"""Gated DeltaNet's chunked form against its recurrence, position by position (fp64)."""

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


def recurrence(q, k, v, beta, alpha, return_state=False):
    """S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t with unit
    q, k, position by position. q, k, v: (B, H, L, D); beta, alpha: (B, H, L)."""
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, dim)
    eye = torch.eye(dim, dtype=q.dtype)
    outs = []
    for t in range(length):
        kt, vt = k[:, :, t], v[:, :, t]
        bt, at = beta[:, :, t, None, None], alpha[:, :, t, None, None]
        erase = eye - bt * kt[..., :, None] * kt[..., None, :]  # (B, H, D, D)
        state = at * state @ erase + bt * vt[..., :, None] * kt[..., None, :]
        outs.append((state @ q[:, :, t, :, None]).squeeze(-1))
    out = torch.stack(outs, dim=2)
    return (out, state) if return_state else out


def _inputs(length, seed=0, heads=3, alpha=None):
    """q, k, v (2, heads, L, 8) and gates (2, heads, L, 2) = (beta, alpha), fp64, with grads."""
    q, k, v = qkv(2, heads, length, 8, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    gates = torch.rand(2, heads, length, 2, generator=g, dtype=torch.float64)
    if alpha is not None:
        gates[..., 1] = alpha
    return q, k, v, gates.requires_grad_()


def _reference(q, k, v, gates):
    return recurrence(q, k, v, gates[..., 0], gates[..., 1])


@pytest.mark.parametrize(
    "length, chunk", [(1, 4), (7, 4), (37, 8), (40, 8), (33, 64), (100, 16), (129, 64)]
)
def test_chunked_form_equals_the_recurrence_forward_and_gradients(length, chunk):
    q, k, v, gates = _inputs(length, seed=length)
    out = build_attention("gated_deltanet", decay="gate", chunk_size=chunk)(q, k, v, gates=gates)
    expected = _reference(q, k, v, gates)
    torch.testing.assert_close(out, expected, **EXACT)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v, gates))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v, gates))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **EXACT)


@pytest.mark.parametrize("alpha", [1e-6, 1e-200])
def test_strong_decay_is_exact_where_a_product_of_the_decays_would_underflow(alpha):
    """Over a chunk of 64 the decays' product (1e-384, 1e-12800) is 0 in float64: the kernel's
    differences of cumulative log-decays still give each pair's own decay."""
    q, k, v, gates = _inputs(100, seed=3, alpha=alpha)
    out = build_attention("gated_deltanet", decay="gate")(q, k, v, gates=gates)
    torch.testing.assert_close(out, _reference(q, k, v, gates), **EXACT)
    grads = torch.autograd.grad(out.sum(), (q, k, v, gates))
    assert all(torch.isfinite(g).all() for g in grads)


def test_a_gate_rounded_to_zero_forgets_everything_before_it():
    q, k, v, gates = (x.detach() for x in _inputs(20, seed=5))
    gates[:, :, 11, 1] = 0.0
    out = build_attention("gated_deltanet", decay="gate", chunk_size=8)(q, k, v, gates=gates)
    torch.testing.assert_close(out, _reference(q, k, v, gates), **EXACT)
    alone = build_attention("gated_deltanet", decay="gate", chunk_size=8)(
        q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], gates=gates[:, :, 11:]
    )
    torch.testing.assert_close(out[:, :, 11:], alone, **EXACT)


def test_no_decay_is_deltanet():
    q, k, v, gates = (x.detach() for x in _inputs(45, seed=6, alpha=1.0))
    out = build_attention("gated_deltanet", decay="gate", chunk_size=8)(q, k, v, gates=gates)
    deltanet = build_attention("deltanet", chunk_size=8)(q, k, v, gates=gates[..., :1])
    torch.testing.assert_close(out, deltanet, **EXACT)


def test_chunk_size_changes_nothing_beyond_rounding():
    q, k, v, gates = (x.detach() for x in _inputs(45, seed=2))
    outs = [
        build_attention("gated_deltanet", decay="gate", chunk_size=c)(q, k, v, gates=gates)
        for c in (1, 3, 16, 64)
    ]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-12, atol=1e-12)


def test_float32_over_many_chunks_matches_the_float64_recurrence():
    """float32, 600 positions (10 chunks) with decays down to 1e-3: each chunk's product of
    decays underflows float32; the outputs keep float32's digits."""
    q, k, v, gates = (x.detach() for x in _inputs(600, seed=4))
    gates[..., 1] = gates[..., 1].clamp_min(1e-3)
    out = build_attention("gated_deltanet", decay="gate")(
        *(x.float() for x in (q, k, v)), gates=gates.float()
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(q, k, v, gates), rtol=1e-4, atol=1e-5)


def test_gated_deltanet_is_causal_only_and_needs_its_two_gates():
    with pytest.raises(
        UnsupportedCombination, match="'gated_deltanet' does not support option causal=False"
    ):
        build_attention("gated_deltanet", causal=False)
    q, k, v, _ = _inputs(5)
    with pytest.raises(ValueError, match="gated_deltanet: option 'gates' is required"):
        build_attention("gated_deltanet", decay="gate")(q, k, v)
    with pytest.raises(ValueError, match=r"gated_deltanet: option 'gates' must have shape .*2\)"):
        build_attention("gated_deltanet", decay="gate")(q, k, v, gates=torch.rand(2, 3, 5, 1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_size": 0}, "gated_deltanet: option 'chunk_size' must be a positive"),
        ({"short_conv": -1}, "gated_deltanet: option 'short_conv' must be a non-negative"),
        ({"feature_map": "relu"}, "gated_deltanet: option 'feature_map' must be one of"),
        ({"decay": "exp"}, "gated_deltanet: option 'decay' must be one of gate, mamba"),
        ({"output_norm": True}, "options 'short_conv' and 'output_norm' need 'n_heads'"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("gated_deltanet", **options)


def test_the_layer_gives_beta_and_alpha_from_the_token_through_a_sigmoid():
    torch.manual_seed(0)
    model = TransformerLM(
        ModelConfig(vocab_size=11, d_model=16, n_heads=2, depth=1, attention="gated_deltanet")
    )
    (layer,) = [m for m in model.modules() if isinstance(m, SelfAttention)]
    assert layer.gates.out_features == 2 * 2  # heads x n_gates
    model(torch.randint(11, (2, 9))).sum().backward()
    assert layer.gates.weight.grad.view(2, 2, -1).abs().sum(-1).gt(0).all()  # beta and alpha


def test_flops_are_deltanets():
    ours, deltanet = build_attention("gated_deltanet", decay="gate"), build_attention("deltanet")
    assert ours.flops(2, 4, 1000, 64) == deltanet.flops(2, 4, 1000, 64) > 0


# --- decay="mamba": the paper's map of the gate --------------------------------------------------


def _mamba_alpha(gate, module):
    """alpha = exp(-exp(A_h) softplus(logit(g) + dt_bias_h)), gate (B, H, L)."""
    dt = torch.nn.functional.softplus(torch.special.logit(gate) + module.dt_bias[:, None])
    return torch.exp(-module.a_log.exp()[:, None] * dt)


def test_mamba_decay_is_the_papers_map_of_the_gate_forward_and_gradients():
    torch.manual_seed(0)
    module = build_attention("gated_deltanet", chunk_size=8, decay="mamba", n_heads=3, head_dim=8)
    module = module.double()

    def expected(q, k, v, gates):
        return recurrence(q, k, v, gates[..., 0], _mamba_alpha(gates[..., 1], module))

    q, k, v, gates = _inputs(37, seed=11)
    torch.testing.assert_close(module(q, k, v, gates=gates), expected(q, k, v, gates), **EXACT)
    assert_same_outputs_and_grads(
        lambda q, k, v, gates: module(q, k, v, gates=gates),
        expected,
        (q, k, v, gates),
        params=[module.a_log, module.dt_bias],
    )


def test_mamba_decay_starts_as_mamba2_and_stays_finite_at_saturated_gates():
    torch.manual_seed(0)
    module = build_attention("gated_deltanet", decay="mamba", n_heads=64, head_dim=8)
    a, dt = module.a_log.exp(), torch.nn.functional.softplus(module.dt_bias)
    assert bool(((a >= 1) & (a <= 16)).all()) and bool(((dt >= 1e-4) & (dt <= 0.1 + 1e-6)).all())
    gates = torch.tensor([0.0, 1e-30, 0.5, 1.0]).expand(1, 64, 4)
    log_alpha = module._log_decay(gates)
    assert bool(torch.isfinite(log_alpha).all()) and bool((log_alpha <= 0).all())


# --- the published layer's parts --------------------------------------------------------------


def _published(**options):
    options = {
        "short_conv": 4,
        "feature_map": "silu",
        "output_norm": True,
        "decay": "gate",
        **options,
    }
    torch.manual_seed(0)
    module = build_attention("gated_deltanet", n_heads=3, head_dim=8, **options).double()
    with torch.no_grad():
        module.norm_weight.uniform_(0.5, 1.5)
    return module


def _expected(module, q, k, v, gates):
    """The published layer written out over the recurrence: the causal depthwise convolution
    out_t = sum_i w_i x_{t - 3 + i} (channel h * 3D + c), SiLU, the recurrence, the RMSNorm."""
    length = q.shape[2]
    x = torch.cat([q, k, v], dim=-1)  # (B, H, L, 3D)
    weight = module.conv.weight.view(3, 24, 4)  # (H, 3D, w)
    padded = torch.nn.functional.pad(x, (0, 0, 3, 0))
    conv = sum(weight[None, :, None, :, i] * padded[:, :, i : i + length] for i in range(4))
    cq, ck, cv = torch.nn.functional.silu(conv).chunk(3, dim=-1)
    out = _reference(cq, ck, cv, gates)
    rms = out.square().mean(-1, keepdim=True).add(1e-6).rsqrt()
    return out * rms * module.norm_weight


def test_published_parts_equal_their_definitions_over_the_recurrence():
    module = _published(chunk_size=8)
    assert_same_outputs_and_grads(
        lambda q, k, v, gates: module(q, k, v, gates=gates),
        lambda q, k, v, gates: _expected(module, q, k, v, gates),
        _inputs(21, seed=7),
        params=list(module.parameters()),
    )


# --- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, kv_heads, options",
    [
        (1, 3, {}),
        (9, 3, {}),
        (13, 3, {}),
        (5, 1, {}),  # grouped KV heads: the cache per query head
        (2, 3, {"short_conv": 4, "feature_map": "silu", "output_norm": True}),
        (9, 1, {"short_conv": 3}),
        (6, 1, {"decay": "mamba"}),
    ],
)
def test_prefill_and_decode_equal_the_forward(prompt, kv_heads, options):
    q, k, v, gates = (x.detach() for x in _inputs(21, seed=3))
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    torch.manual_seed(0)
    module = build_attention("gated_deltanet", chunk_size=4, n_heads=3, head_dim=8, **options)
    module = module.double().eval()
    full = module(q, k, v, gates=gates)
    cache = module.init_cache(2, 3, 8, max_len=21, dtype=torch.float64, n_kv_heads=kv_heads)
    decoded = prefill_then_decode(module, q, k, v, cache, prompt, gates)
    torch.testing.assert_close(decoded, full, **EXACT)


@pytest.mark.parametrize("prompt", [1, 8, 19])
def test_prefill_leaves_the_recurrences_state(prompt):
    q, k, v, gates = (x.detach() for x in _inputs(prompt, seed=8))
    module = build_attention("gated_deltanet", decay="gate", chunk_size=4)
    cache = module.init_cache(2, 3, 8, max_len=32, dtype=torch.float64)
    module.prefill(q, k, v, cache, gates)
    _, state = recurrence(q, k, v, gates[..., 0], gates[..., 1], return_state=True)
    torch.testing.assert_close(cache.state, state.transpose(-1, -2), **EXACT)  # M = S^T
    assert cache.length == prompt and cache.nbytes == 2 * 3 * 8 * 8 * 8


# --- masks and grouped KV heads ---------------------------------------------------------------


@pytest.mark.parametrize("masks", ["padding", "documents", "both"])
def test_masks_run_each_documents_real_positions_as_their_own_sequence(masks):
    keep, segments = padding_and_documents(batch=2, length=37, seed=6)
    keep = keep if masks != "documents" else None
    segments = segments if masks != "padding" else None
    q, k, v, gates = _inputs(37, seed=9)
    kernel = build_attention("gated_deltanet", decay="gate", chunk_size=8)

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
        (2, True, {"decay": "mamba"}),
        (2, False, {"short_conv": 4}),
    ],
)
def test_grouped_heads_equal_the_kernel_on_repeated_keys(kv_heads, masks, options):
    keep, segments = padding_and_documents(batch=2, length=37, seed=6)
    given = mask_kwargs(keep, segments) if masks else {}
    torch.manual_seed(0)
    kernel = build_attention("gated_deltanet", chunk_size=8, n_heads=4, head_dim=8, **options)
    kernel = kernel.double()
    gates = torch.rand(2, 4, 37, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    q, _, _ = qkv(2, 4, 37, 8, seed=7)
    _, k, v = qkv(2, kv_heads, 37, 8, seed=8)

    def gated(q, k, v, **m):
        return kernel(q, k, v, gates=gates, **m)

    assert_grouped_equals_repeated(gated, q, k, v, given, params=list(kernel.parameters()))
