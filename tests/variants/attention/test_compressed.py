"""Memory-compressed attention against dense references whose masks are built here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    assert_layout_independent,
    causal_mask,
    dense_attention,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
)
from variants import build_attention
from variants.attention.common import flash
from variants.registry import attention_spec

HEAD_DIM = 8
METHODS = ("conv", "mean", "max")


def build(method, factor=4, causal=False):
    return build_attention(
        "compressed", causal=causal, factor=factor, method=method, head_dim=HEAD_DIM
    ).double()


def reference_compress(module, x, conv):
    """Compress block by block with a Python loop, independently of the module's batched code."""
    factor, length = module.factor, x.shape[2]
    summaries = []
    for start in range(0, length, factor):
        block = x[:, :, start : start + factor]  # (B, H, <= f, D): real positions only
        if module.method == "mean":
            summaries.append(block.mean(dim=2))
        elif module.method == "max":
            summaries.append(block.amax(dim=2))
        else:
            block = F.pad(block, (0, 0, 0, factor - block.shape[2]))  # zero padding, as documented
            channels = block.flatten(0, 1).transpose(1, 2)  # (B*H, D, f)
            summaries.append(conv(channels)[..., 0].unflatten(0, x.shape[:2]))
    return torch.stack(summaries, dim=2)  # (B, H, C, D)


def reference_mask(length, factor, causal):
    """(L, C + L) bool over [compressed keys, raw keys]: True where query i may attend."""
    n_blocks = -(-length // factor)
    mask = torch.zeros(length, n_blocks + length, dtype=torch.bool)
    for i in range(length):
        own_start = i // factor * factor
        for c in range(n_blocks):
            block_end = (c + 1) * factor - 1
            mask[i, c] = not causal or block_end < own_start
        if causal:
            mask[i, n_blocks + own_start : n_blocks + i + 1] = True
    return mask


def reference_output(module, q, k, v):
    keys = reference_compress(module, k, module.key_conv)
    values = reference_compress(module, v, module.value_conv)
    mask = reference_mask(q.shape[2], module.factor, module.causal)
    return dense_attention(q, torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2), mask)


def set_identity_conv(module):
    with torch.no_grad():
        for conv in (module.key_conv, module.value_conv):
            conv.weight.copy_(torch.eye(HEAD_DIM)[:, :, None])  # (out, in, kernel 1)
            conv.bias.zero_()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [False, True])
def test_factor_one_identity_compression_is_full_attention(method, causal):
    module = build(method, factor=1, causal=causal)
    if method == "conv":
        set_identity_conv(module)
    q, k, v = qkv(length=13, head_dim=HEAD_DIM)
    mask = causal_mask(13) if causal else None
    torch.testing.assert_close(module(q, k, v), dense_attention(q, k, v, mask))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [16, 18])  # a multiple of factor 4, and not
def test_matches_dense_reference(method, causal, length, flash_kernels):
    module = build(method, factor=4, causal=causal)
    q, k, v = qkv(length=length, head_dim=HEAD_DIM, seed=1)
    torch.testing.assert_close(module(q, k, v), reference_output(module, q, k, v))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("length", "factor"), [(16, 4), (18, 4), (3, 4), (9, 3)])
def test_causal_gradients_match_the_dense_reference(method, length, factor, flash_kernels):
    # Gradients of q, k, v and of the compression (conv weights) against plain autograd
    # through the dense reference; L=3 < f has no past blocks at all.
    module = build(method, factor=factor, causal=True)
    q, k, v = qkv(length=length, head_dim=HEAD_DIM, seed=2, requires_grad=True)
    grad_out = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(3))
    inputs = (q, k, v, *module.parameters())
    got = torch.autograd.grad(module(q, k, v), inputs, grad_out)
    want = torch.autograd.grad(reference_output(module, q, k, v), inputs, grad_out)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("length", [24, 23])
def test_causal_outputs_ignore_the_future(method, length):
    assert_causal(build(method, factor=4, causal=True), length=length, head_dim=HEAD_DIM)


@pytest.mark.parametrize("method", METHODS)
def test_first_position_sees_only_itself_with_finite_gradients(method):
    module = build(method, factor=4, causal=True)
    q, k, v = qkv(length=10, head_dim=HEAD_DIM, requires_grad=True)
    out = module(q, k, v)
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])  # no compressed block has ended yet
    out.square().sum().backward()
    for tensor in (q, k, v, *module.parameters()):
        assert torch.isfinite(tensor.grad).all()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [16, 18])
def test_flops_count_the_reference_pairs(method, causal, length):
    module = build(method, factor=4, causal=causal)
    pairs = int(reference_mask(length, 4, causal).sum())
    expected = 4 * 2 * 3 * pairs * HEAD_DIM
    if method == "conv":
        n_blocks = -(-length // 4)
        expected += 2 * 2 * 2 * 3 * n_blocks * 4 * HEAD_DIM * HEAD_DIM
    assert module.flops(2, 3, length, HEAD_DIM) == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"factor": 0}, "compressed: option 'factor' must be a positive integer"),
        ({"method": "sum"}, "compressed: option 'method' must be one of conv, mean, max"),
        ({"head_dim": -1}, "compressed: option 'head_dim' must be a positive integer"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("compressed", **options)


def test_conv_head_dim_must_match_inputs():
    module = build("conv")
    q, k, v = qkv(length=8, head_dim=HEAD_DIM * 2)
    with pytest.raises(ValueError, match="compressed: option 'head_dim'=8 must equal"):
        module(q, k, v)


def test_capabilities():
    spec = attention_spec("compressed")
    assert (spec.exact, spec.causal_supported, spec.bounded_length) == (False, True, False)
    assert spec.options == {"factor": 4, "method": "conv"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_causal_half_precision_matches_the_dense_reference(dtype, flash_kernels):
    module = build("mean", factor=4, causal=True)
    q, k, v = qkv(length=18, head_dim=HEAD_DIM, seed=5)
    out = module(*(x.to(dtype) for x in (q, k, v)))
    assert torch.isfinite(out).all()
    expected = reference_output(module, q, k, v)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


def test_causal_strided_inputs_give_the_contiguous_result(flash_kernels):
    module = build("conv", factor=4, causal=True)
    q, k, v = qkv(batch=1, length=18, head_dim=HEAD_DIM, seed=6)
    assert_layout_independent(module, (q, k, v))


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kv_heads", [2, 1])  # 4 query heads: groups of 2 and of 4
@pytest.mark.parametrize("masks", ["none", "padding", "segments"])
def test_grouped_heads_equal_the_kernel_on_repeated_keys(
    fused, causal, method, kv_heads, masks, monkeypatch
):
    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", fused)
    keep, segments = padding_and_documents(batch=2, length=23, seed=4)  # 23: a partial block
    given = mask_kwargs(
        keep if masks == "padding" else None, segments if masks == "segments" else None
    )
    torch.manual_seed(0)
    module = build(method, causal=causal)
    q, _, _ = qkv(batch=2, heads=4, length=23, seed=5)
    _, k, v = qkv(batch=2, heads=kv_heads, length=23, seed=6)
    params = tuple(module.parameters())
    assert_grouped_equals_repeated(module, q, k, v, given, params=params)


@pytest.mark.parametrize("method", METHODS)
def test_decodes_grouped_heads_from_a_cache_of_kv_heads(method):
    torch.manual_seed(0)
    module = build(method, factor=3, causal=True)
    q, _, _ = qkv(batch=2, heads=4, length=14, seed=8)
    _, k, v = qkv(batch=2, heads=2, length=14, seed=9)
    cache = module.init_cache(2, 4, HEAD_DIM, max_len=14, dtype=q.dtype, n_kv_heads=2)
    assert cache.keys_buffer.shape[1] == 2  # the cache holds the KV heads only
    got = prefill_then_decode(module, q, k, v, cache, 7)
    torch.testing.assert_close(got, module(q, k, v))
