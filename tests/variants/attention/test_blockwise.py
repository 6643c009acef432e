"""Blockwise (local) attention against dense masks of its pattern built here from positions."""

import pytest
import torch

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    dense_attention,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
    shared_qk_reference,
)
from variants.registry import build_attention

# (seq_len, block_size, look_backward, look_forward)
PATTERNS = [
    (16, 4, 1, 1),
    (32, 8, 2, 0),
    (24, 4, 0, 2),
    (20, 8, 0, 0),
    (37, 5, 2, 1),  # 37 = 7 * 5 + 2: two real positions in the last block
]


def blockwise_mask(length, block_size, look_backward, look_forward, causal):
    """(L, L) bool: key block within [query block - back, query block + fwd], j <= i if causal."""
    position = torch.arange(length)
    query_block = (position // block_size)[:, None]
    key_block = (position // block_size)[None, :]
    if causal:
        return (key_block >= query_block - look_backward) & (position[None, :] <= position[:, None])
    return (key_block >= query_block - look_backward) & (key_block <= query_block + look_forward)


def blockwise(causal, block_size, look_backward, look_forward):
    return build_attention(
        "blockwise",
        causal=causal,
        block_size=block_size,
        look_backward=look_backward,
        look_forward=look_forward,
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [12, 64])
def test_block_covering_the_sequence_is_full_attention(causal, block_size):
    q, k, v = qkv(length=12)
    mask = torch.ones(12, 12, dtype=torch.bool).tril() if causal else None
    out = blockwise(causal, block_size, 1, 1)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, mask))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size, look_backward, look_forward", PATTERNS)
def test_matches_dense_mask_of_pattern(causal, length, block_size, look_backward, look_forward):
    q, k, v = qkv(length=length, seed=length)
    mask = blockwise_mask(length, block_size, look_backward, look_forward, causal)
    out = blockwise(causal, block_size, look_backward, look_forward)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, mask))


@pytest.mark.parametrize("causal", [False, True])
def test_length_not_multiple_of_block_equals_dense_masked_result(causal):
    # 13 = 3 * 4 + 1: the last block holds one real query and three padded keys.
    q, k, v = qkv(length=13, seed=3)
    out = blockwise(causal, 4, 1, 1)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, blockwise_mask(13, 4, 1, 1, causal)))


@pytest.mark.parametrize("length, block_size, look_backward, look_forward", PATTERNS)
@pytest.mark.parametrize("causal", [False, True])
def test_flops_count_allowed_pairs(causal, length, block_size, look_backward, look_forward):
    allowed = int(blockwise_mask(length, block_size, look_backward, look_forward, causal).sum())
    module = blockwise(causal, block_size, look_backward, look_forward)
    assert module.flops(2, 3, length, 8) == 4 * 2 * 3 * allowed * 8


def test_causal_ignores_look_forward():
    q, k, v = qkv(length=16)
    torch.testing.assert_close(blockwise(True, 4, 1, 0)(q, k, v), blockwise(True, 4, 1, 3)(q, k, v))


@pytest.mark.parametrize("block_size, look_backward", [(4, 1), (5, 0), (3, 2)])
def test_causal_never_sees_the_future(block_size, look_backward):
    assert_causal(blockwise(True, block_size, look_backward, 1), length=24, t=10)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_dense_reference(causal):
    q, k, v = qkv(batch=1, heads=2, length=11, head_dim=4, seed=5, requires_grad=True)
    out = blockwise(causal, 3, 1, 1)(q, k, v)
    expected = dense_attention(q, k, v, blockwise_mask(11, 3, 1, 1, causal))
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    expected_grads = torch.autograd.grad(expected, (q, k, v), upstream)
    torch.testing.assert_close(grads, expected_grads)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"block_size": 0}, "blockwise: option 'block_size' must be a positive integer, got 0"),
        ({"block_size": 2.5}, "option 'block_size' must be a positive integer"),
        ({"look_backward": -1}, "option 'look_backward' must be a non-negative integer, got -1"),
        ({"look_forward": -2}, "option 'look_forward' must be a non-negative integer, got -2"),
    ],
)
def test_bad_options_are_rejected_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("blockwise", **options)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size, look_backward, look_forward", PATTERNS)
def test_shared_qk_matches_reference_on_the_pattern(
    causal, length, block_size, look_backward, look_forward
):
    q, _, v = qkv(length=length, seed=length)
    mask = blockwise_mask(length, block_size, look_backward, look_forward, causal)
    module = build_attention(
        "blockwise",
        causal=causal,
        block_size=block_size,
        look_backward=look_backward,
        look_forward=look_forward,
        shared_qk=True,
    )
    torch.testing.assert_close(module(q, q, v), shared_qk_reference(q, v, mask))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, block_size, look_backward, look_forward", PATTERNS)
def test_pattern_is_the_hand_written_mask(causal, length, block_size, look_backward, look_forward):
    module = blockwise(causal, block_size, look_backward, look_forward)
    expected = blockwise_mask(length, block_size, look_backward, look_forward, causal)
    assert torch.equal(module.pattern(length).dense(length), expected)


# Eager FlexAttention spends about a second on each new block mask: few cases.
@pytest.mark.parametrize("causal, length, block_size", [(False, 37, 5), (True, 20, 64)])
def test_flex_forward_equals_the_native_kernel(causal, length, block_size, eager_flex):
    q, k, v = qkv(batch=1, heads=2, length=length, seed=1)
    options = {"causal": causal, "block_size": block_size, "look_backward": 2}
    native = build_attention("blockwise", **options)(q, k, v)
    torch.testing.assert_close(
        build_attention("blockwise", impl="flex", **options)(q, k, v), native
    )


def test_flex_refuses_to_train_on_cpu(eager_flex):
    q, k, v = qkv(batch=1, heads=1, length=8, requires_grad=True)
    message = "blockwise: option impl='flex' runs forward only on CPU"
    with pytest.raises(ValueError, match=message):
        build_attention("blockwise", impl="flex")(q, k, v)


def test_flex_with_shared_qk_is_refused():
    with pytest.raises(ValueError, match="blockwise: option impl='flex' does not support shared"):
        build_attention("blockwise", impl="flex", shared_qk=True)


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])  # 4 query heads: groups of 2 and of 4
@pytest.mark.parametrize("masks", ["padding", "segments", "both"])
def test_grouped_heads_with_masks_equal_the_kernel_on_repeated_keys(causal, kv_heads, masks):
    keep, segments = padding_and_documents(batch=2, length=23, seed=4)  # 23: a partial block
    given = mask_kwargs(
        keep if masks != "segments" else None, segments if masks != "padding" else None
    )
    kernel = build_attention("blockwise", causal=causal, block_size=4, look_backward=2)
    q, _, _ = qkv(batch=2, heads=4, length=23, seed=5)
    _, k, v = qkv(batch=2, heads=kv_heads, length=23, seed=6)
    assert_grouped_equals_repeated(kernel, q, k, v, given)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_heads_without_masks_equal_the_kernel_on_repeated_keys(causal, kv_heads):
    kernel = build_attention("blockwise", causal=causal, block_size=5, look_forward=2)
    q, _, _ = qkv(batch=2, heads=4, length=17, seed=7)
    _, k, v = qkv(batch=2, heads=kv_heads, length=17, seed=8)
    assert_grouped_equals_repeated(kernel, q, k, v)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_decodes_grouped_heads_from_a_cache_of_kv_heads(kv_heads):
    kernel = build_attention("blockwise", causal=True, block_size=3, look_backward=1)
    q, _, _ = qkv(batch=2, heads=4, length=11, seed=8)
    _, k, v = qkv(batch=2, heads=kv_heads, length=11, seed=9)
    cache = kernel.init_cache(2, 4, 8, max_len=11, dtype=q.dtype, n_kv_heads=kv_heads)
    assert cache.ring_keys.shape[1] == kv_heads  # the cache holds the KV heads only
    got = prefill_then_decode(kernel, q, k, v, cache, 5)
    torch.testing.assert_close(got, kernel(q, k, v))


def test_flex_forward_with_grouped_heads_equals_the_native_kernel(eager_flex):
    q, _, _ = qkv(batch=1, heads=4, length=20, seed=2)
    _, k, v = qkv(batch=1, heads=2, length=20, seed=3)
    options = {"causal": True, "block_size": 5, "look_backward": 1}
    native = build_attention("blockwise", **options)(q, k, v)
    torch.testing.assert_close(
        build_attention("blockwise", impl="flex", **options)(q, k, v), native
    )
