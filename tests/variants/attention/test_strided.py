"""Strided (Sparse Transformer) attention against dense masks of its pattern built here."""

import math

import pytest
import torch

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    assert_layout_independent,
    dense_attention,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
)
from variants.registry import build_attention

# (seq_len, stride); "auto" means round(sqrt(seq_len)), the kernel built for a model of
# max_seq_len = seq_len (causally the auto stride is taken at max(L, max_seq_len))
PATTERNS = [(16, 4), (18, 4), (23, 5), (9, 1), (12, 12), (7, 30), (30, "auto"), (50, "auto")]


def _strided(causal, stride, length, **options):
    """The kernel as a model of `length` tokens at most builds it."""
    return build_attention("strided", causal=causal, stride=stride, max_seq_len=length, **options)


def strided_mask(length, stride, causal):
    """(L, L) bool: (i - j) mod stride == 0 or the `stride` nearest keys; j <= i if causal."""
    if stride == "auto":
        stride = round(math.sqrt(length))
    offset = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # i - j
    allowed = (offset % stride == 0) | (offset.abs() < stride)
    return allowed & (offset >= 0) if causal else allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, stride", PATTERNS)
def test_matches_dense_mask_of_pattern(causal, length, stride, flash_kernels):
    q, k, v = qkv(length=length, seed=length)
    out = _strided(causal, stride, length)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, strided_mask(length, stride, causal)))


@pytest.mark.parametrize("causal", [False, True])
def test_length_not_multiple_of_stride_equals_dense_masked_result(causal):
    # 22 = 4 * 5 + 2: the last row of the (rows, stride) view holds two real positions.
    q, k, v = qkv(length=22, seed=2)
    out = build_attention("strided", causal=causal, stride=5)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, strided_mask(22, 5, causal)))


def test_auto_stride_follows_sequence_length():
    module = build_attention("strided", stride="auto", max_seq_len=1)  # below every length
    assert [module.stride_for(n) for n in (1, 10, 64, 1000)] == [1, 3, 8, 32]


def test_causal_auto_stride_is_taken_at_the_model_length():
    # At most the length itself (a longer stride is the same pattern); past max_seq_len, the
    # length's own, as without a model.
    module = build_attention("strided", causal=True, stride="auto", max_seq_len=400)
    assert [module.stride_for(n) for n in (10, 64, 400, 1000)] == [10, 20, 20, 32]
    assert module.stride_for(64, at=900) == 30  # decoding: the cache's max_len


@pytest.mark.parametrize("length, stride", PATTERNS)
@pytest.mark.parametrize("causal", [False, True])
def test_flops_count_allowed_pairs(causal, length, stride):
    allowed = int(strided_mask(length, stride, causal).sum())
    module = _strided(causal, stride, length)
    assert module.flops(2, 3, length, 8) == 4 * 2 * 3 * allowed * 8


@pytest.mark.parametrize("stride", [3, 5, "auto"])
def test_causal_never_sees_the_future(stride):
    assert_causal(_strided(True, stride, 24), length=24, t=10)


@pytest.mark.parametrize("causal", [False, True])
# (7, 5): two rows, the second mostly padding, so unmasked queries in columns 2-4 have no
# strided key at all; (9, 1): every key is strided; (12, 12): no strided part.
@pytest.mark.parametrize("length, stride", [(14, 4), (22, 5), (7, 5), (9, 1), (12, 12)])
def test_gradients_match_dense_reference(causal, length, stride, flash_kernels):
    q, k, v = qkv(batch=2, heads=2, length=length, head_dim=4, seed=7, requires_grad=True)
    out = build_attention("strided", causal=causal, stride=stride)(q, k, v)
    expected = dense_attention(q, k, v, strided_mask(length, stride, causal))
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    # Rows without strided keys (logsumexp -inf) must not leak NaN into the gradients.
    assert all(torch.isfinite(g).all() for g in got)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("stride", [0, -3, "sqrt", 2.0, True, None])
def test_bad_stride_is_rejected_by_name(stride):
    message = "strided: option 'stride' must be a positive integer or 'auto', got "
    with pytest.raises(ValueError, match=message):
        build_attention("strided", stride=stride)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_without_strided_keys_stay_finite(dtype, flash_kernels):
    # L=7, stride 5, unmasked: queries in columns 2-4 have no real strided key. Their column
    # part has every key hidden, which must weigh 0, not NaN (MASKED_SCORE is -inf in float16).
    q, k, v = qkv(batch=1, heads=2, length=7, head_dim=8, seed=3)
    out = build_attention("strided", stride=5)(*(x.to(dtype) for x in (q, k, v)))
    assert torch.isfinite(out).all()
    expected = dense_attention(q, k, v, strided_mask(7, 5, causal=False))
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_strided_inputs_give_the_contiguous_result(causal, flash_kernels):
    q, k, v = qkv(batch=1, heads=3, length=22, head_dim=4, seed=4)
    module = build_attention("strided", causal=causal, stride=5)
    assert_layout_independent(module, (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, stride", PATTERNS)
def test_pattern_is_the_hand_written_mask(causal, length, stride):
    module = _strided(causal, stride, length)
    assert torch.equal(module.pattern(length).dense(length), strided_mask(length, stride, causal))


@pytest.mark.parametrize("causal, length, stride", [(True, 22, 5), (False, 30, "auto")])
def test_flex_forward_equals_the_native_kernel(causal, length, stride, eager_flex):
    q, k, v = qkv(batch=1, heads=2, length=length, seed=2)
    native = _strided(causal, stride, length)(q, k, v)
    flex = _strided(causal, stride, length, impl="flex")(q, k, v)
    torch.testing.assert_close(flex, native)


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])  # 4 query heads: groups of 2 and of 4
@pytest.mark.parametrize("masks", ["none", "padding", "segments", "both"])
@pytest.mark.parametrize("batch", [1, 2])  # the grouped layout is a view at batch 1 only
def test_grouped_heads_equal_the_kernel_on_repeated_keys(
    causal, kv_heads, masks, batch, flash_kernels
):
    keep, segments = padding_and_documents(batch=batch, length=23, seed=4)  # 23: partial rows
    given = mask_kwargs(
        keep if masks in ("padding", "both") else None,
        segments if masks in ("segments", "both") else None,
    )
    kernel = build_attention("strided", causal=causal, stride=5)
    q, _, _ = qkv(batch=batch, heads=4, length=23, seed=5)
    _, k, v = qkv(batch=batch, heads=kv_heads, length=23, seed=6)
    assert_grouped_equals_repeated(kernel, q, k, v, given)


def test_decodes_grouped_heads_from_a_cache_of_kv_heads():
    kernel = build_attention("strided", causal=True, stride=3)
    q, _, _ = qkv(batch=2, heads=4, length=14, seed=8)
    _, k, v = qkv(batch=2, heads=2, length=14, seed=9)
    cache = kernel.init_cache(2, 4, q.shape[-1], max_len=14, dtype=q.dtype, n_kv_heads=2)
    assert cache.keys_buffer.shape[1] == 2  # the cache holds the KV heads only
    got = prefill_then_decode(kernel, q, k, v, cache, 6)
    torch.testing.assert_close(got, kernel(q, k, v))


def test_flex_forward_with_grouped_heads_equals_the_native_kernel(eager_flex):
    q, _, _ = qkv(batch=1, heads=4, length=20, seed=2)
    _, k, v = qkv(batch=1, heads=2, length=20, seed=3)
    native = build_attention("strided", causal=True, stride=4)(q, k, v)
    flex = build_attention("strided", causal=True, stride=4, impl="flex")(q, k, v)
    torch.testing.assert_close(flex, native)
