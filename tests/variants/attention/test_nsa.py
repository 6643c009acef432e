"""NSA's three gated branches against per-query references written from the issue's rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import (
    Gated,
    assert_causal,
    assert_grouped_equals_repeated,
    assert_same_outputs_and_grads,
    band_rule,
    causal_rule,
    dense_attention,
    mask_kwargs,
    nsa_reference,
    padding_and_documents,
    prefill_then_decode,
    qkv,
    rule_mask,
)
from variants import UnsupportedCombination, build_attention
from variants.attention.common import selection
from variants.attention.nsa import function as nsa_function

HEAD_DIM = 8


def mean_blocks(block):
    def compress(x):
        return torch.stack(
            [x[:, :, s : s + block].mean(dim=2) for s in range(0, x.shape[2], block)], dim=2
        )

    return compress


def mlp_blocks(mlp, block):
    """The module's MLP written out: zero-pad, add the position vectors, two linear maps."""

    def compress(x):
        n = -(-x.shape[2] // block)
        blocks = F.pad(x, (0, 0, 0, n * block - x.shape[2])).unflatten(2, (n, block))
        hidden = (blocks + mlp.position).flatten(3) @ mlp.hidden.weight.T + mlp.hidden.bias
        return F.gelu(hidden) @ mlp.out.weight.T + mlp.out.bias

    return compress


@pytest.mark.parametrize("compress", ["mean", "mlp"])
@pytest.mark.parametrize(
    "length, block, n_select, window",
    [
        (37, 4, 3, 6),  # odd length, short last block
        (40, 8, 2, 16),  # a multiple of the block
        (5, 8, 4, 3),  # no compressed block yet: that branch gives 0
        (30, 7, 10, 100),  # n_select and window above what there is
        (21, 4, 1, 1),  # own block only, a window of the query itself
    ],
)
def test_nsa_equals_the_reference_forward_and_gradients(
    flash_kernels, compress, length, block, n_select, window
):
    torch.manual_seed(length)
    kernel = build_attention(
        "nsa",
        block_size=block,
        n_select=n_select,
        window=window,
        compress=compress,
        head_dim=HEAD_DIM,
    ).double()
    q, k, v = qkv(1, 2, length, HEAD_DIM, seed=length, requires_grad=True)
    gates = torch.rand(1, 2, length, 3, dtype=torch.float64).requires_grad_()
    out = kernel(q, k, v, gates=gates)
    if compress == "mean":
        summaries = mean_blocks(block), mean_blocks(block)
    else:
        summaries = mlp_blocks(kernel.key_mlp, block), mlp_blocks(kernel.value_mlp, block)
    expected = nsa_reference(q, k, v, gates, block, n_select, window, *summaries)
    torch.testing.assert_close(out, expected)
    inputs = (q, k, v, gates, *kernel.parameters())
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), inputs, materialize_grads=True)
    want = torch.autograd.grad(
        (expected * weights).sum(), inputs, allow_unused=True, materialize_grads=True
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("window", [1, 4, 6, 11, 100])
def test_nsa_window_branch_over_several_tiles_and_chunks(flash_kernels, monkeypatch, window):
    """The window branch alone in tiles of 4 queries (the last one short), one tile or two per
    fused call: forward and gradients as dense attention over i - window < j <= i."""
    monkeypatch.setattr(nsa_function, "WINDOW_ROWS", 4)
    q, k, v = qkv(1, 2, 23, HEAD_DIM, seed=window)
    mask = rule_mask(23, lambda i, j: causal_rule(i, j) and band_rule(window)(i, j))
    for tiles_per_call in (1, 2):
        width = min(window, 23) + 4
        monkeypatch.setattr(
            nsa_function, "WINDOW_CHUNK_BYTES", tiles_per_call * 2 * 2 * width * 8 * 8
        )
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out = nsa_function.WindowBranch.apply(*x, window)
        expected = dense_attention(*x, mask)
        torch.testing.assert_close(out, expected)
        weights = torch.randn_like(out)
        got = torch.autograd.grad((out * weights).sum(), x)
        want = torch.autograd.grad((expected * weights).sum(), x)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_nsa_is_causal():
    torch.manual_seed(0)
    kernel = build_attention("nsa", block_size=4, n_select=2, window=5, head_dim=HEAD_DIM)
    assert_causal(Gated(kernel.double()), length=30, t=13, head_dim=HEAD_DIM)


def test_nsa_is_causal_only_and_needs_three_gates():
    with pytest.raises(UnsupportedCombination, match="'nsa' does not support option causal=False"):
        build_attention("nsa", causal=False)
    q, k, v = qkv(1, 2, 9, HEAD_DIM)
    kernel = build_attention("nsa", compress="mean")
    with pytest.raises(ValueError, match="nsa: option 'gates' is required"):
        kernel(q, k, v)
    with pytest.raises(ValueError, match="nsa: option 'compress' must be one of mean, mlp"):
        build_attention("nsa", compress="conv")


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
# (kv_heads of 4 query heads, masks, length): groups of 2 and 4, short last block or whole ones
GROUPED = [(2, "none", 29), (1, "none", 28), (2, "both", 29), (1, "segments", 28)]


@pytest.mark.parametrize("kv_heads, masks, length", GROUPED)
@pytest.mark.parametrize("compress", ["mean", "mlp"])
def test_grouped_heads_equal_the_kernel_on_repeated_keys(
    flash_kernels, monkeypatch, compress, kv_heads, masks, length
):
    # Window tiles of 4 queries, one per call: several calls per (sequence, KV head).
    monkeypatch.setattr(nsa_function, "WINDOW_ROWS", 4)
    monkeypatch.setattr(nsa_function, "WINDOW_CHUNK_BYTES", 1)
    keep, segments = padding_and_documents(batch=2, length=length, seed=6)
    given = mask_kwargs(
        keep if masks == "both" else None, segments if masks in ("segments", "both") else None
    )
    torch.manual_seed(0)
    options = {"block_size": 4, "n_select": 3, "window": 6, "compress": compress}
    kernel = Gated(build_attention("nsa", head_dim=HEAD_DIM, **options)).double()
    q, _, _ = qkv(2, 4, length, HEAD_DIM, seed=7)
    _, k, v = qkv(2, kv_heads, length, HEAD_DIM, seed=8)
    assert_grouped_equals_repeated(kernel, q, k, v, given, params=list(kernel.parameters()))


def test_decodes_grouped_heads_from_a_cache_of_kv_heads():
    torch.manual_seed(0)
    kernel = build_attention("nsa", block_size=4, n_select=3, window=6, head_dim=HEAD_DIM)
    q, _, _ = qkv(2, 4, 19, HEAD_DIM, seed=8)
    _, k, v = qkv(2, 2, 19, HEAD_DIM, seed=9)
    gates = torch.rand(2, 4, 19, 3, generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    cache = kernel.init_cache(2, 4, HEAD_DIM, max_len=19, dtype=q.dtype, n_kv_heads=2)
    got = prefill_then_decode(kernel, q, k, v, cache, 6, gates)
    assert cache.keys().shape[1] == 2  # the KV heads only
    with torch.no_grad():
        whole = kernel(q, k, v, gates)
    torch.testing.assert_close(got, whole)


# --- shared selection: one choice of blocks per GQA group, as the paper has it ---------------
@pytest.mark.parametrize("compress", ["mean", "mlp"])
@pytest.mark.parametrize("kv_heads, length, block, n_select", [(2, 29, 4, 3), (1, 24, 4, 3)])
def test_shared_selection_sums_the_groups_probabilities(
    flash_kernels, compress, kv_heads, length, block, n_select
):
    """Each query head reads the blocks its group's summed compressed-branch probabilities
    rank highest: the reference on the KV heads repeated to the query heads, group summed."""
    torch.manual_seed(1)
    options = {"block_size": block, "n_select": n_select, "window": 5, "compress": compress}
    shared = build_attention("nsa", head_dim=HEAD_DIM, shared_selection=True, **options)
    shared = shared.double()
    q, _, _ = qkv(1, 4, length, HEAD_DIM, seed=3)
    _, k, v = qkv(1, kv_heads, length, HEAD_DIM, seed=4)
    gates = torch.rand(1, 4, length, 3, generator=torch.Generator().manual_seed(2))
    gates = gates.double()
    group = 4 // kv_heads
    if compress == "mean":
        summaries = mean_blocks(block), mean_blocks(block)
    else:
        summaries = mlp_blocks(shared.key_mlp, block), mlp_blocks(shared.value_mlp, block)

    def reference(q, k, v, gates, group=group):
        k, v = (x.repeat_interleave(4 // kv_heads, dim=1) for x in (k, v))
        return nsa_reference(q, k, v, gates, block, n_select, 5, *summaries, group=group)

    inputs = (q, k, v, gates)
    assert_same_outputs_and_grads(shared, reference, inputs, params=list(shared.parameters()))
    # The test tells the two rules apart: each head's own choice reads other blocks here.
    with torch.no_grad():
        per_head = reference(*inputs, group=1)
        assert not torch.allclose(shared(*inputs), per_head)


def test_shared_selection_without_groups_is_the_per_head_kernel(flash_kernels):
    keep, segments = padding_and_documents(batch=2, length=27, seed=5)
    options = {"block_size": 4, "n_select": 3, "window": 6, "head_dim": HEAD_DIM}
    torch.manual_seed(0)
    per_head = build_attention("nsa", **options).double()
    shared = build_attention("nsa", shared_selection=True, **options).double()
    shared.load_state_dict(per_head.state_dict())
    q, k, v = qkv(2, 4, 27, HEAD_DIM, seed=6)
    gates = torch.rand(2, 4, 27, 3, generator=torch.Generator().manual_seed(1)).double()
    for masks in ({}, mask_kwargs(keep, segments)):
        assert torch.equal(shared(q, k, v, gates, **masks), per_head(q, k, v, gates, **masks))


@pytest.mark.parametrize("masked", [False, True], ids=["no masks", "padding and documents"])
def test_top_blocks_per_group_against_explicit_probabilities(monkeypatch, masked):
    """`top_blocks(per_group=True)` over several row ranges (rows where the own block just
    ended included): per group, the candidates ranked by the summed softmax probability over
    the blocks ended by the query (under masks only the blocks wholly in its document)."""
    monkeypatch.setattr(selection, "SCORE_ROWS", 7)
    block, slots, length, heads, kv_heads = 4, 2, 30, 4, 2
    q, k, _ = qkv(2, heads, length, HEAD_DIM, seed=9)
    summaries = mean_blocks(block)(k[:, :kv_heads])  # (B, H_kv, n, D)
    keep, segments = padding_and_documents(batch=2, length=length, seed=3)
    docs = selection.DocumentBlocks(keep, segments, length, block) if masked else None
    adjust = docs.hide_outside if masked else None
    got = selection.top_blocks(q, summaries, block, slots, True, adjust, per_group=True)
    group, n = heads // kv_heads, summaries.shape[2]
    whole = docs.whole(slice(0, length), n) if masked else torch.ones(2, length, n, dtype=bool)
    for b in range(2):
        for h in range(heads):
            g = h // group
            for i in range(length):
                seen = [c for c in range(n) if (c + 1) * block - 1 <= i and whole[b, i, c]]
                total = dict.fromkeys(seen, 0.0)
                for m in range(g * group, (g + 1) * group):
                    if seen:
                        s = torch.stack([q[b, m, i] @ summaries[b, g, c] for c in seen])
                        for c, p in zip(seen, torch.softmax(s * HEAD_DIM**-0.5, 0), strict=True):
                            total[c] += float(p)
                candidates = [c for c in seen if c < i // block]
                best = sorted(candidates, key=lambda c: total[c], reverse=True)[:slots]
                assert got[b, h, i].tolist() == best + [-1] * (slots - len(best)), (b, h, i)


def test_shared_selection_decodes_as_it_runs_whole(flash_kernels):
    torch.manual_seed(0)
    options = {"block_size": 4, "n_select": 3, "window": 6, "head_dim": HEAD_DIM}
    kernel = build_attention("nsa", shared_selection=True, **options).double()
    q, _, _ = qkv(2, 4, 23, HEAD_DIM, seed=10)
    _, k, v = qkv(2, 2, 23, HEAD_DIM, seed=11)
    gates = torch.rand(2, 4, 23, 3, generator=torch.Generator().manual_seed(1)).double()
    cache = kernel.init_cache(2, 4, HEAD_DIM, max_len=23, dtype=q.dtype, n_kv_heads=2)
    got = prefill_then_decode(kernel, q, k, v, cache, 6, gates)
    with torch.no_grad():
        torch.testing.assert_close(got, kernel(q, k, v, gates))


def test_shared_selection_is_a_bool():
    with pytest.raises(ValueError, match="nsa: option 'shared_selection' must be true or false"):
        build_attention("nsa", shared_selection="yes")
