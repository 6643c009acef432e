"""MoBA against a dense mask built query by query from the issue's rule (tests/reference.py)."""

from __future__ import annotations

import pytest
import torch

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    dense_attention,
    mask_kwargs,
    moba_mask,
    padding_and_documents,
    prefill_then_decode,
    qkv,
)
from variants import UnsupportedCombination, build_attention
from variants.attention.common import selected_blocks


def _grads(out, inputs, weights):
    return torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "length, block, top_k",
    [
        (37, 8, 3),  # odd length: a short last block
        (40, 8, 2),  # a multiple of the block
        (5, 8, 4),  # one block only: the first block, top_k above the number of blocks
        (45, 7, 10),  # top_k larger than the blocks there are
        (23, 4, 1),  # own block only
    ],
)
def test_moba_equals_the_dense_reference_forward_and_gradients(
    flash_kernels, causal, length, block, top_k
):
    q, k, v = qkv(2, 3, length, 8, seed=length, requires_grad=True)
    kernel = build_attention("moba", causal=causal, block_size=block, top_k=top_k)
    out = kernel(q, k, v)
    mask = moba_mask(q.detach(), k.detach(), block, top_k, causal)
    expected = dense_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    grads, wanted = _grads(out, (q, k, v), weights), _grads(expected, (q, k, v), weights)
    for got, want in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("length", [29, 28], ids=["short-last-block", "whole-blocks"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_moba_running_merge_over_chunks_and_far_apart_parts(
    flash_kernels, monkeypatch, causal, length
):
    """The selected blocks' parts merged chunk by chunk (one tile per chunk: a query's parts
    meet across chunks) and, in chunks of two tiles of two rows, a query's parts in one chunk;
    some blocks score far above the own block (a part lse more than SHIFT_LIMIT above the
    running reference, which is then raised). Tiles of two rows leave unused rows wherever a
    block has an odd number of queries; with whole blocks the key gradients are added in place.
    Forward and gradients as the dense reference."""
    monkeypatch.setattr(selected_blocks, "TILE_ROWS", 2)
    q, k, v = qkv(1, 2, length, 8, seed=5)
    k[:, :, 8:12] += 12 * q[:, :, 20:21]  # block 2 scores high with the queries near 20
    k[:, :, 16:20] -= 12 * q[:, :, 25:26]
    for chunk_tiles in (1, 2):
        monkeypatch.setattr(selected_blocks, "CHUNK_BYTES", chunk_tiles * (2 * 4 + 2 * 2) * 8 * 8)
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out = build_attention("moba", causal=causal, block_size=4, top_k=3)(*x)
        expected = dense_attention(*x, moba_mask(q, k, 4, 3, causal))
        torch.testing.assert_close(out, expected)
        weights = torch.randn_like(out)
        for got, want in zip(_grads(out, x, weights), _grads(expected, x, weights), strict=True):
            torch.testing.assert_close(got, want)


def test_moba_selection_is_data_dependent_and_top_k_covering_every_block_is_full_attention():
    q, k, v = qkv(1, 2, 33, 8, seed=3)
    every = build_attention("moba", causal=True, block_size=4, top_k=9)(q, k, v)
    idx = torch.arange(33)
    full = dense_attention(q, k, v, idx[None, :] <= idx[:, None])
    torch.testing.assert_close(every, full)
    fewer = build_attention("moba", causal=True, block_size=4, top_k=2)(q, k, v)
    assert not torch.allclose(fewer, full)


def test_moba_is_causal():
    assert_causal(build_attention("moba", causal=True, block_size=4, top_k=3), length=30, t=13)


def test_moba_flops_count_the_selected_pairs():
    kernel = build_attention("moba", causal=True, block_size=4, top_k=2)
    # 10 positions, blocks [0,4), [4,8), [8,10): own-block pairs 10 + 10 + 3, one earlier
    # block of 4 keys for the 6 queries after the first block; routing scores 4 * 1 + 2 * 2.
    pairs, candidates = 23 + 6 * 4, 4 * 1 + 2 * 2
    assert kernel.flops(1, 1, 10, 8) == 4 * pairs * 8 + 2 * candidates * 8


def test_moba_options_are_checked():
    with pytest.raises(ValueError, match="moba: option 'top_k' must be a positive integer"):
        build_attention("moba", top_k=0)
    assert not isinstance(ValueError(), UnsupportedCombination)


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
# (kv_heads of 4 query heads, masks, length): groups of 2 and 4, short last block or whole ones
GROUPED = [(2, "none", 29), (1, "none", 28), (2, "both", 29), (1, "segments", 28)]


@pytest.mark.parametrize("kv_heads, masks, length", GROUPED)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_grouped_heads_equal_the_kernel_on_repeated_keys(
    flash_kernels, monkeypatch, causal, kv_heads, masks, length
):
    # Tiles of two rows: a block's queries of several heads share tiles and leave unused rows.
    monkeypatch.setattr(selected_blocks, "TILE_ROWS", 2)
    keep, segments = padding_and_documents(batch=2, length=length, seed=6)
    given = mask_kwargs(
        keep if masks == "both" else None, segments if masks in ("segments", "both") else None
    )
    kernel = build_attention("moba", causal=causal, block_size=4, top_k=3)
    q, _, _ = qkv(2, 4, length, 8, seed=7)
    _, k, v = qkv(2, kv_heads, length, 8, seed=8)
    assert_grouped_equals_repeated(kernel, q, k, v, given)


def test_decodes_grouped_heads_from_a_cache_of_kv_heads():
    kernel = build_attention("moba", causal=True, block_size=4, top_k=3)
    q, _, _ = qkv(2, 4, 19, 8, seed=8)
    _, k, v = qkv(2, 2, 19, 8, seed=9)
    cache = kernel.init_cache(2, 4, 8, max_len=19, dtype=q.dtype, n_kv_heads=2)
    got = prefill_then_decode(kernel, q, k, v, cache, 6)
    assert cache.keys().shape[1] == 2  # the KV heads only
    torch.testing.assert_close(got, kernel(q, k, v))
