"""Routing attention against dense shared-QK references of its pattern, built here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.reference import (
    assert_causal,
    assert_layout_independent,
    assert_same_outputs_and_grads,
    causal_mask,
    document_reference_mask,
    mask_kwargs,
    padded_zero,
    padding_and_documents,
    qkv,
    shared_qk_reference,
)
from variants import build_attention
from variants.attention.common import buffers
from variants.attention.common.base import replaying


def build(causal=False, heads=2, head_dim=8, **options):
    options = {"n_clusters": 3, "window": 4, "seed": 0, **options}
    module = build_attention(
        "routing", causal=causal, n_heads=heads, head_dim=head_dim, **options
    ).double()
    return module


def allowed_pairs(clusters, window, causal):
    """(B, H, L, L) bool from the definition: j in i's cluster, at most `window` - 1 members
    before i (causal: and not after it; non-causal: or after it), one pair at a time."""
    batch, heads, length = clusters.shape
    allowed = torch.zeros(batch, heads, length, length, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            row = clusters[b, h].tolist()
            rank = {p: sum(1 for r in range(p) if row[r] == row[p]) for p in range(length)}
            for i in range(length):
                for j in range(length):
                    gap = rank[i] - rank[j]
                    near = 0 <= gap < window if causal else abs(gap) < window
                    allowed[b, h, i, j] = row[i] == row[j] and near
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 5, 16, 37])
def test_one_cluster_and_a_long_window_is_exact_shared_qk_attention(causal, length, flash_kernels):
    q, _, v = qkv(2, 3, length, 8)
    module = build(causal, heads=3, n_clusters=1, window=length)
    allowed = causal_mask(length) if causal else torch.ones(length, length, dtype=torch.bool)
    torch.testing.assert_close(module(q, q, v), shared_qk_reference(q, v, allowed))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("length", "window"), [(24, 4), (37, 5), (30, 40)])
def test_each_query_sees_its_clusters_members_within_the_window(
    causal, length, window, flash_kernels
):
    # Several clusters straddling chunk edges, a padded length (37 = 7 chunks of 5 + 2), and a
    # window longer than the sequence (one chunk).
    q, _, v = qkv(2, 2, length, 8, seed=length)
    module = build(causal, window=window).eval()
    out = module(q, q, v)
    clusters = module.last_clusters.long()
    assert clusters.unique().numel() == 3  # every cluster in use, so the pattern is real
    expected = shared_qk_reference(q, v, allowed_pairs(clusters, window, causal))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("which", ["padding", "documents", "both"])
@pytest.mark.parametrize("causal", [False, True])
def test_masks_keep_every_run_within_its_document_and_off_padded_keys(which, causal, flash_kernels):
    # L=26, window 4: seven chunks (the last padded), three clusters. A pair of the query's run
    # stays only where the document mask allows it too; padded tokens join the padding
    # cluster, so the reference's runs (from the kernel's clusters) leave them out. Rows left
    # with only the query itself attend to it (the self rule's fallback).
    keep, segments = padding_and_documents(length=26, seed=1)
    keep, segments = (
        (None if which == "documents" else keep),
        (None if which == "padding" else segments),
    )
    masks = mask_kwargs(keep, segments)
    q, _, v = qkv(2, 2, 26, 8, seed=2)
    module = build(causal)
    module(q, q, v, **masks)  # routes (and trains): the reference reads its clusters
    clusters = module.last_clusters.long()
    if keep is not None:
        assert (clusters == 3).eq(~keep[:, None]).all()
    allowed = allowed_pairs(clusters, 4, causal) & document_reference_mask(keep, segments)

    def routing(q, v):
        with replaying():
            return module(q, q, v, **masks)

    def reference(q, v):
        return padded_zero(shared_qk_reference(q, v, allowed), keep)

    assert_same_outputs_and_grads(routing, reference, (q, v))


def test_padded_tokens_move_no_centroid_and_reach_no_real_output():
    keep, segments = padding_and_documents(length=26, seed=1)
    q, _, v = qkv(2, 2, 26, 8, seed=3)
    changed_q, changed_v = q.clone(), v.clone()
    changed_q[~keep[:, None].expand(-1, 2, -1)] *= -5  # padded tokens only
    changed_v[~keep[:, None].expand(-1, 2, -1)] += 1
    first, second, plain = build(decay=0.9), build(decay=0.9), build(decay=0.9)
    out = first(q, q, v, attention_mask=keep, segment_ids=segments)
    changed = second(changed_q, changed_q, changed_v, attention_mask=keep, segment_ids=segments)
    plain(q, q, v)
    assert torch.equal(first.centroid_sums, second.centroid_sums)
    assert torch.equal(first.centroid_counts, second.centroid_counts)
    assert not torch.equal(first.centroid_counts, plain.centroid_counts)
    torch.testing.assert_close(out, changed)  # padded rows are zeros in both


def test_clusters_are_the_nearest_centroids_of_the_layer_normed_queries():
    q, _, v = qkv(1, 2, 20, 8)
    module = build().eval()
    module(q, q, v)
    x = (q - q.mean(-1, keepdim=True)) / (q.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    scores = torch.einsum("bhld,hkd->bhlk", x, module.centroids)
    assert torch.equal(module.last_clusters.long(), scores.argmax(-1))


def test_causal_in_eval_and_under_replay():
    # Clusters depend on each token's own query, so later tokens change no earlier output.
    assert_causal(build(causal=True).eval(), length=40, t=17)
    module = build(causal=True)
    q, _, v = qkv(1, 2, 40, 8)
    module(q, q, v)  # training: the centroids move, the clusters are cached
    with replaying():
        assert_causal(module, length=40, t=17, replay=True)


def test_evaluating_before_any_training_works():
    q, _, v = qkv(2, 2, 50, 8, dtype=torch.float32)
    module = build_attention("routing", n_heads=2, head_dim=8).eval()
    out = module(q, q, v)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_training_forward_is_one_ema_step_and_eval_or_replay_none():
    q, _, v = qkv(2, 2, 30, 8)
    module = build(decay=0.9)
    sums, counts = module.centroid_sums.clone(), module.centroid_counts.clone()
    module(q, q, v)
    clusters = module.last_clusters.long()
    x = F.layer_norm(q, (8,))
    for h in range(2):
        for c in range(3):
            members = clusters[:, h] == c  # (B, L)
            want_count = 0.9 * counts[h, c] + 0.1 * members.sum()
            want_sum = 0.9 * sums[h, c] + 0.1 * x[:, h][members].sum(0)
            torch.testing.assert_close(module.centroid_counts[h, c], want_count.double())
            torch.testing.assert_close(module.centroid_sums[h, c], want_sum)
    after = module.centroid_sums.clone(), module.centroid_counts.clone()
    with replaying():
        module(q * 2, q * 2, v)  # replayed: no update, and the cached clusters
    assert torch.equal(module.last_clusters.long(), clusters)
    module.eval()
    module(q * 3, q * 3, v)
    assert torch.equal(module.centroid_sums, after[0])
    assert torch.equal(module.centroid_counts, after[1])


def test_seed_fixes_the_initial_centroids():
    first = build_attention("routing", seed=1).centroid_sums
    assert torch.equal(first, build_attention("routing", seed=1).centroid_sums)
    assert not torch.equal(first, build_attention("routing", seed=2).centroid_sums)
    torch.testing.assert_close(first.norm(dim=-1), torch.full((4, 16), 8.0))  # sqrt(64)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_with_replayed_clusters(causal, flash_kernels):
    q, _, v = qkv(1, 2, 14, 4, requires_grad=True)
    module = build(causal, head_dim=4)
    module(q, q, v)
    with replaying():
        assert torch.autograd.gradcheck(lambda a, b: module(a, a, b), (q, v), fast_mode=True)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_one_chunk_per_call_changes_nothing(causal, masked, monkeypatch):
    q, _, v = qkv(2, 2, 30, 8, seed=3, requires_grad=True)
    masks = mask_kwargs(*padding_and_documents(length=30)) if masked else {}
    module = build(causal)
    out = module(q, q, v, **masks)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    monkeypatch.setattr(buffers, "PIECE_BYTES", 1)  # routing's budget too
    with replaying():
        sliced = module(q, q, v, **masks)
        sliced_grads = torch.autograd.grad(sliced.square().sum(), (q, v))
    torch.testing.assert_close(sliced, out)
    torch.testing.assert_close(sliced_grads, grads)


def test_strided_inputs_give_the_contiguous_result(flash_kernels):
    q, _, v = qkv(1, 2, 30, 8, seed=5)
    module = build(causal=True)
    assert_layout_independent(lambda q, v: module(q, q, v), (q, v), replay=True)


@pytest.mark.parametrize("causal", [False, True])
def test_flops_of_one_cluster_with_a_long_window_equal_full_attention(causal):
    full = build_attention("full", causal=causal).flops(1, 4, 100, 64)
    assert build_attention("routing", causal=causal, window=128).flops(1, 4, 100, 64) == full
    # Window 2, causal: the first query has 1 key, every other 2; non-causal 3 (2 at the ends).
    keys = 1 + 99 * 2 if causal else 2 + 98 * 3 + 2
    assert build_attention("routing", causal=causal, window=2).flops(1, 1, 100, 8) == 4 * keys * 8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_clusters": 0}, "routing: option 'n_clusters' must be a positive integer, got 0"),
        ({"window": -1}, "routing: option 'window' must be a positive integer, got -1"),
        ({"decay": 1.0}, r"routing: option 'decay' must be in \[0, 1\), got 1.0"),
        ({"seed": -1}, "routing: option 'seed' must be a non-negative integer, got -1"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("routing", **options)


def test_heads_must_match_the_centroids():
    q, _, v = qkv(1, 3, 4, 64)
    with pytest.raises(ValueError, match="routing: options 'n_heads'=4 and 'head_dim'=64"):
        build_attention("routing")(q, q, v)
