"""LSH attention against dense shared-QK references built here, independently of the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

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
from variants import attention_spec, build_attention
from variants.attention.common import buffers
from variants.attention.common.base import replaying
from variants.attention.lsh import bucket_windows, hashing, masks

REPO = Path(__file__).resolve().parents[3]


def window_counts(buckets, length, bucket_size):
    """(B, H, L, L) int: in how many rounds key j is in query i's window.

    Straight from the definition, one position at a time: sort each round's positions by
    (bucket, position), cut into chunks, a query sees its chunk and the previous one (wrapping).
    `buckets` is (B, H, R, Lp) and includes the padded positions.
    """
    batch, heads, rounds, padded = buckets.shape
    n_chunks = padded // bucket_size
    counts = torch.zeros(batch, heads, length, length, dtype=torch.long)
    for b in range(batch):
        for h in range(heads):
            for r in range(rounds):
                row = buckets[b, h, r].tolist()
                order = sorted(range(padded), key=lambda p: (row[p], p))
                chunk = {p: slot // bucket_size for slot, p in enumerate(order)}
                for i in range(length):
                    for j in range(length):
                        if chunk[j] in (chunk[i], (chunk[i] - 1) % n_chunks):
                            counts[b, h, i, j] += 1
    return counts


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 2, 4])
@pytest.mark.parametrize("length", [5, 16, 27, 32])
def test_short_sequences_equal_dense_shared_qk(causal, n_hashes, length):
    # With L <= 2m every window is the whole sequence, in every round (L=5, 27: padded).
    q, k, v = qkv(2, 3, length, 8)
    module = build_attention("lsh", causal=causal, n_hashes=n_hashes, bucket_size=16, seed=3)
    allowed = causal_mask(length) if causal else torch.ones(length, length, dtype=torch.bool)
    torch.testing.assert_close(module(q, k, v), shared_qk_reference(q, v, allowed))


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3, 8])
@pytest.mark.parametrize("length", [22, 40])
def test_rounds_combine_over_the_union_of_windows(dedup, causal, n_hashes, length, flash_kernels):
    # The real test of multi-round LSH: 6 and 10 chunks of m=4 (L=22 is padded), so windows
    # differ between rounds. dedup=True is a softmax over the union of the windows; dedup=False
    # weighs each pair by the number of rounds whose windows hold it.
    q, k, v = qkv(1, 2, length, 8, seed=n_hashes)
    q = q * 3  # sharper scores: a wrong weight on a shared pair shows clearly
    module = build_attention(
        "lsh", causal=causal, n_hashes=n_hashes, bucket_size=4, n_buckets=6, dedup=dedup
    )
    out = module(q, k, v)
    counts = window_counts(module.last_buckets, length, bucket_size=4)
    allowed = counts > 0
    if causal:
        allowed = allowed & causal_mask(length)
    expected = shared_qk_reference(q, v, allowed, multiplicity=None if dedup else counts)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("which", ["padding", "documents", "both"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_hashes", "dedup"), [(1, True), (3, True), (3, False)])
def test_masks_keep_every_window_within_its_document_and_off_padded_keys(
    which, causal, n_hashes, dedup, flash_kernels
):
    # L=22, m=4: six chunks (the last padded), so windows differ between rounds. A window's
    # pair stays only where the document mask allows it too; padded tokens go to the padding
    # bucket, and the reference's windows come from the kernel's buckets (hence with them).
    # Rows left with only the query itself attend to it (the self rule's fallback).
    keep, segments = padding_and_documents(length=22, seed=1)
    keep, segments = (
        (None if which == "documents" else keep),
        (None if which == "padding" else segments),
    )
    given = mask_kwargs(keep, segments)
    q, _, v = qkv(2, 2, 22, 8, seed=n_hashes)
    q = q * 3  # sharper scores: a pair with a wrong weight shows clearly
    module = build_attention(
        "lsh", causal=causal, n_hashes=n_hashes, bucket_size=4, n_buckets=6, dedup=dedup, seed=4
    )
    module(q, q, v, **given)  # hashes: the reference reads its buckets
    buckets = module.last_buckets
    if keep is not None:
        assert (buckets[..., :22].long() == 6).eq(~keep[:, None, None]).all()
    counts = window_counts(buckets, 22, bucket_size=4)
    allowed = (counts > 0) & document_reference_mask(keep, segments)
    if causal:
        allowed = allowed & causal_mask(22)

    def lsh(q, v):
        with replaying():
            return module(q, q, v, **given)

    def reference(q, v):
        out = shared_qk_reference(q, v, allowed, multiplicity=None if dedup else counts)
        return padded_zero(out, keep)

    assert_same_outputs_and_grads(lsh, reference, (q, v))


@pytest.mark.parametrize("causal", [False, True])
def test_masks_rebuilt_per_slice_and_round_change_nothing(causal, monkeypatch):
    # Above MASK_BYTES the window masks, documents included, are rebuilt per slice of
    # sequences and round, in forward and again in backward (`masks.RoundMasks`).
    keep, segments = padding_and_documents(length=22, seed=2)
    given = mask_kwargs(keep, segments)
    q, _, v = qkv(2, 2, 22, 8, seed=5, requires_grad=True)
    module = build_attention("lsh", causal=causal, n_hashes=3, bucket_size=4, seed=6)
    out = module(q, q, v, **given)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    monkeypatch.setattr(masks, "MASK_BYTES", 1)
    monkeypatch.setattr(buffers, "SLICE_BYTES", 1)
    with replaying():
        rebuilt = module(q, q, v, **given)
        rebuilt_grads = torch.autograd.grad(rebuilt.square().sum(), (q, v))
    torch.testing.assert_close(rebuilt, out)
    torch.testing.assert_close(rebuilt_grads, grads)


def test_padded_positions_are_never_keys():
    # L=100, m=32: 28 padded slots share the last chunk with real tokens and sit in windows of
    # real queries. The reference sorts the padded slots too (so chunk edges are the kernel's)
    # but offers only real keys; a padded key with any weight, or a padded query's output left
    # in place, breaks the equality.
    q, k, v = qkv(1, 2, 100, 8, seed=1)
    module = build_attention("lsh", n_hashes=2, bucket_size=32, n_buckets=4, seed=0)
    out = module(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()
    allowed = window_counts(module.last_buckets, 100, bucket_size=32) > 0
    torch.testing.assert_close(out, shared_qk_reference(q, v, allowed))


def test_default_bucket_count_and_padding_bucket():
    # Lp = 128, m = 32: the paper's 2 Lp / m = 8 buckets; padded positions get the extra one.
    q, k, v = qkv(2, 2, 100, 8)
    module = build_attention("lsh", n_hashes=3, bucket_size=32, seed=0)
    module(q, k, v)
    buckets = module.last_buckets
    assert buckets.shape == (2, 2, 3, 128)
    assert buckets[..., :100].min() >= 0 and buckets[..., :100].max() < 8
    assert (buckets[..., 100:] == 8).all()


def test_key_argument_is_ignored():
    q, k, v = qkv(1, 2, 24, 8)
    module = build_attention("lsh", bucket_size=4, seed=0)
    torch.testing.assert_close(module(q, k, v), module(q, torch.randn_like(k), v))


def test_hash_is_angular():
    # A positively scaled copy of a vector shares its bucket; the opposite vector lands n_buckets/2
    # further, the argmax over [xR; -xR] switching halves.
    q, k, v = qkv(1, 1, 8, 16)
    q = torch.cat([q, 2.5 * q, -q], dim=2)  # (1, 1, 24, 16)
    module = build_attention("lsh", n_hashes=3, bucket_size=4, n_buckets=8, seed=0)
    module(q, q, v.repeat(1, 1, 3, 1))
    buckets = module.last_buckets[0, 0]  # (R, 24)
    assert torch.equal(buckets[:, :8], buckets[:, 8:16])
    assert torch.equal(buckets[:, 16:], (buckets[:, :8] + 4) % 8)
    assert buckets.min() >= 0 and buckets.max() < 8


def test_causal_under_replayed_buckets():
    # The sort is global, so a later token's bucket can reshape earlier windows (module
    # docstring); with the buckets replayed no later key or value may reach earlier outputs.
    module = build_attention("lsh", causal=True, n_hashes=2, bucket_size=4, seed=0)
    q, k, v = qkv(1, 2, 32, 8)
    module(q, k, v)  # hashes the sequence assert_causal starts from
    with replaying():
        assert_causal(module, length=32, t=13)


def test_seed_reproduces():
    q, k, v = qkv(1, 2, 64, 8)
    first = build_attention("lsh", bucket_size=4, seed=7)(q, k, v)
    assert torch.equal(build_attention("lsh", bucket_size=4, seed=7)(q, k, v), first)


def test_fresh_rotations_differ_but_replaying_reuses_the_buckets():
    q, k, v = qkv(1, 2, 64, 8)
    module = build_attention("lsh", bucket_size=4)
    first = module(q, k, v)
    second = module(q, k, v)
    assert not torch.equal(first, second)
    buckets = module.last_buckets.clone()
    with replaying():
        again = module(q, k, v)
    assert torch.equal(again, second)
    assert torch.equal(module.last_buckets, buckets)


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, heads", [(1, 1), (2, 2)])
def test_gradcheck(causal, dedup, batch, heads, flash_kernels):
    # 14 tokens, m = 4: four chunks with padding, two rounds, so masks and dedup are all active;
    # with 2 x 2 sequences one slice holds several, and the per-slice sort offsets count.
    q, k, v = qkv(batch, heads, 14, 4, requires_grad=True)
    module = build_attention(
        "lsh", causal=causal, n_hashes=2, bucket_size=4, n_buckets=4, seed=1, dedup=dedup
    )
    module(q, k, v)
    # Replayed buckets: gradcheck's perturbations must not move a vector across a bucket edge.
    with replaying():
        assert torch.autograd.gradcheck(lambda a, b: module(a, k, b), (q, v), fast_mode=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [3, 4, 7])
def test_gradcheck_with_one_or_two_chunks(causal, length, flash_kernels):
    # m = 4: one chunk (padded or not), or two chunks with padding: windows without a previous
    # chunk, and the wrap-around bringing the other chunk.
    q, k, v = qkv(1, 2, length, 4, requires_grad=True)
    module = build_attention("lsh", causal=causal, n_hashes=2, bucket_size=4, seed=1)
    module(q, k, v)
    with replaying():
        assert torch.autograd.gradcheck(lambda a, b: module(a, k, b), (q, v), fast_mode=True)


def test_flops_count_the_two_chunk_window():
    module = build_attention("lsh", n_hashes=4, bucket_size=64)
    assert module.flops(1, 4, 4096, 64) == 4 * 4 * 4 * 4096 * 128 * 64
    assert module.flops(1, 1, 100, 8) == 4 * 4 * 128 * 128 * 8  # padded to 128: two chunks
    assert module.flops(1, 1, 10, 8) == 4 * 4 * 64 * 64 * 8  # one chunk: its own 64 keys


def test_config_mirrors_the_code_defaults():
    config = yaml.safe_load((REPO / "conf" / "attention" / "lsh.yaml").read_text())
    assert config == {"name": "lsh", **attention_spec("lsh").options}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_hashes": 0}, "lsh: option 'n_hashes' must be a positive integer, got 0"),
        ({"bucket_size": -4}, "lsh: option 'bucket_size' must be a positive integer, got -4"),
        ({"n_buckets": 0}, "lsh: option 'n_buckets' must be a positive integer, got 0"),
        ({"n_buckets": 7}, "lsh: option 'n_buckets' must be even"),
        ({"seed": -1}, "lsh: option 'seed' must be a non-negative integer, got -1"),
        ({"dedup": "yes"}, "lsh: option 'dedup' must be true or false"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("lsh", **options)


def test_product_hash_above_128_buckets_uses_every_bucket_and_keeps_neighbours_together():
    # 512 buckets > SINGLE_HASH_MAX_BUCKETS: the two-factor angular hash path.
    module = build_attention("lsh", n_hashes=1, bucket_size=16, n_buckets=512, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 4096, 32, generator=g)
    near = x + 1e-3 * torch.randn(x.shape, generator=g)
    module(x, x, x)
    buckets = module.last_buckets[0, 0, 0].clone()
    module(near, near, near)
    near_buckets = module.last_buckets[0, 0, 0]
    assert buckets.min() >= 0 and buckets.max() < 512
    assert buckets.unique().numel() > 400  # ~4096 draws into 512 buckets reach nearly all
    assert (buckets == near_buckets).float().mean() > 0.95  # a nearby vector shares its bucket
    assert (buckets == buckets.roll(1)).float().mean() < 0.05  # unrelated vectors do not


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("length", "dedup"), [(40, True), (38, True), (38, False)])
@pytest.mark.parametrize(
    ("one_sequence_per_slice", "chunks_per_piece", "n_pieces"),
    [(True, 1, 10), (False, 1, 10), (True, 3, 4)],  # 3 chunks: 3 + 3 + 3 + 1
)
def test_slicing_the_sequences_changes_nothing(
    causal,
    length,
    dedup,
    one_sequence_per_slice,
    chunks_per_piece,
    n_pieces,
    monkeypatch,
    flash_kernels,
):
    """The window attention runs in slices of the B*H sequences, as many per slice as a byte
    budget allows, and its backward in ranges of chunks; small budgets here make every
    sequence its own slice, or split every round into ranges of one or three chunks (the last
    one shorter), with and without padding and dedup."""
    q, _, v = qkv(2, 2, length, 8, seed=7, requires_grad=True)
    module = build_attention("lsh", causal=causal, n_hashes=3, bucket_size=4, seed=2, dedup=dedup)
    out = module(q, q, v)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    assert len(buffers.sequence_slices(q.flatten(0, 1), 4, n_chunks=10)) == 1
    n_seq = 4
    if one_sequence_per_slice:
        monkeypatch.setattr(buffers, "SLICE_BYTES", 1)
        assert len(buffers.sequence_slices(q.flatten(0, 1), 4, n_chunks=10)) == 4
        n_seq = 1
    # One chunk's window gradients: n_seq sequences x 2m keys x D, float64.
    monkeypatch.setattr(buffers, "PIECE_BYTES", chunks_per_piece * n_seq * 8 * 8 * 8)
    assert len(buffers.chunk_pieces((n_seq, 10, 4, 8), window=8, element_size=8)) == n_pieces
    with replaying():
        sliced = module(q, q, v)
        sliced_grads = torch.autograd.grad(sliced.square().sum(), (q, v))
    torch.testing.assert_close(sliced, out)
    for got, want in zip(sliced_grads, grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("m", [64, 1])
def test_masks_at_32768_positions_do_not_wrap_around(causal, m):
    # Positions and chunk indices compare as int16 where they fit; 32768 itself (the length,
    # or the chunk count with m = 1) does not, and int16 wraps it around without an error.
    # Two identical rounds: the first hides nothing but later keys, the second every key.
    length = 32768
    order = torch.arange(length).expand(1, 2, length)  # (S, R, Lp): every round unsorted
    hidden = masks.hidden_keys(order, order, length, m, causal=causal, dedup=True)  # (1,2,C,m,2m)
    first, second = hidden[0, 0].bool(), hidden[0, 1].bool()
    if causal:
        query = torch.arange(length).view(-1, m, 1)  # (C, m, 1)
        key = bucket_windows.window_keys(torch.arange(length).view(1, -1, m))[0]  # (C, 1, 2m)
        assert torch.equal(first, (key > query).expand_as(first))
    else:
        assert not first.any()
    assert second.all()


def test_strided_inputs_give_the_contiguous_result(flash_kernels):
    # The model hands the kernel (B, H, L, D) views of (B, L, H, D) projections.
    q, _, v = qkv(1, 3, 40, 8, seed=5)
    module = build_attention("lsh", causal=True, n_hashes=2, bucket_size=4, seed=0)
    assert_layout_independent(lambda q, v: module(q, q, v), (q, v), replay=True)


def test_hash_is_the_argmax_over_both_signs_in_mixed_radix(monkeypatch):
    # Independent reference: per factor, argmax over [xR_f; -xR_f] built in full; the factors
    # combine first-most-significant. Rows are hashed in blocks; a 1-byte budget makes every
    # row its own block, which must change nothing.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64)
    rotations = torch.randn(8, 2, 4 + 8, generator=g, dtype=torch.float64)  # factors 8 and 16
    projected = torch.einsum("bhld,drc->bhrlc", x, rotations)  # (B, H, R, L, 12)
    first, second = projected[..., :4], projected[..., 4:]
    first_bucket = torch.cat([first, -first], dim=-1).argmax(dim=-1)  # (B, H, R, L) in [0, 8)
    second_bucket = torch.cat([second, -second], dim=-1).argmax(dim=-1)  # in [0, 16)
    want = first_bucket * 16 + second_bucket
    whole = hashing.angular_hash(x, rotations, (8, 16))
    assert whole.shape == (2, 3, 2, 40)
    assert torch.equal(whole, want)
    monkeypatch.setattr(buffers, "PIECE_BYTES", 1)
    assert torch.equal(hashing.angular_hash(x, rotations, (8, 16)), want)
