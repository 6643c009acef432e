"""The kernel contract's masks and grouped KV heads (`variants.attention.common.masking`), on every
variant that claims them: outputs and gradients against independent fp64 references.

- pattern variants: a dense (L, L) mask from the pattern and the padding / document mask
  (written out in `tests.reference`), plain softmax attention, padded query rows zeroed;
- state variants (linear, performer, deltanet): each document's real positions run alone,
  the outputs put back (padded rows zero);
- compressed: each document's real positions compressed and attended alone (test_compressed's
  loop reference); Linformer: each document alone, padded keys and values zeroed, projected by
  the first columns;
- grouped KV heads: the same kernel on explicitly repeated k, v.

LSH and routing, whose pairs depend on their buckets and clusters, are tested in their own
modules against the same document mask.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

import variants
from tests.reference import (
    Gated,
    assert_grouped_equals_repeated,
    assert_same_outputs_and_grads,
    causal_mask,
    dense_attention,
    dense_softmax_row,
    document_reference_mask,
    each_document_alone,
    mask_kwargs,
    padded_zero,
    padding_and_documents,
    prefill_then_decode,
    qkv,
    shared_qk_reference,
)
from tests.variants.attention.test_compressed import reference_output as compressed_reference
from tests.variants.attention.test_nsa import mlp_blocks
from variants.attention.common import flash, selected_blocks
from variants.attention.common.base import sample_gates
from variants.attention.common.selection import DocumentBlocks
from variants.attention.nsa import function as nsa_function
from variants.checks import UnsupportedCombination

MASKS = ["padding", "documents", "both"]
LENGTH = 24


def _masks(which):
    keep, segments = padding_and_documents(length=LENGTH)
    return (None if which == "documents" else keep), (None if which == "padding" else segments)


# Combined patterns with strided columns, and with summary keys and random blocks; each with
# global rows (non-causal) over more than one block, blocks and strides that do not divide L.
COMBINED_STRIDED = (
    "combined",
    {"parts": ("local", "strided", "global"), "block_size": 4, "stride": 5, "n_global": 6},
)
COMBINED_SUMMARY = (
    "combined",
    {
        "parts": ("summary", "global", "random"),
        "block_size": 5,
        "n_summary": 2,
        "n_global": 6,
        "seed": 0,
    },
)
PATTERN_CASES = [
    ("full", {"impl": "sdpa"}),
    ("full", {"impl": "math"}),
    ("full", {"impl": "sdpa", "shared_qk": True}),
    ("full", {"impl": "math", "shared_qk": True}),
    ("blockwise", {"block_size": 8}),
    ("blockwise", {"block_size": 5, "look_forward": 0}),  # L not a multiple of the block
    ("blockwise", {"block_size": 8, "shared_qk": True}),
    ("strided", {"stride": 4}),
    ("strided", {"stride": 5}),  # L not a multiple of the stride
    ("strided", {"stride": "auto"}),
    ("combined", {"parts": ("local", "global"), "block_size": 5, "n_global": 3}),
    COMBINED_STRIDED,
    COMBINED_SUMMARY,
    ("combined", {"parts": ("strided",), "block_size": 8, "stride": 5}),
    # No part holds the query itself: masks can leave a row no key (its output is then zero).
    ("combined", {"parts": ("random",), "block_size": 4, "n_random": 2, "seed": 3}),
    ("longformer", {"block_size": 5, "n_global": 2}),
    ("bigbird", {"block_size": 4, "n_global": 4, "n_random": 2, "seed": 0}),
    ("sparse_fixed", {"block_size": 5, "n_summary": 2}),
]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize(
    "name, options",
    PATTERN_CASES,
    ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in PATTERN_CASES],
)
def test_pattern_variants_match_a_dense_masked_reference(name, options, causal, which):
    _assert_matches_dense_masked_reference(name, options, causal, which)


# The combined pieces' biases on the explicit matmuls that other devices take (the cases above
# run PyTorch's fused CPU kernels): tiles, global rows, strided columns and summary keys.
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize(
    "name, options", [COMBINED_STRIDED, COMBINED_SUMMARY], ids=["strided", "summary"]
)
def test_combined_masks_on_the_explicit_kernels(name, options, causal, monkeypatch):
    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", False)
    _assert_matches_dense_masked_reference(name, options, causal, "both")


def _assert_matches_dense_masked_reference(name, options, causal, which):
    """`name`'s outputs and gradients with the masks `which` equal softmax attention over
    its dense pattern and `document_reference_mask`, padded query rows zeroed."""
    kernel = variants.build_attention(name, causal=causal, **options)
    keep, segments = _masks(which)
    pattern = kernel.pattern(LENGTH)  # None for full: every pair, or the causal ones
    if pattern is not None:
        allowed = pattern.dense(LENGTH)
    else:
        allowed = causal_mask(LENGTH) if causal else torch.ones(LENGTH, LENGTH, dtype=torch.bool)
    allowed = allowed & document_reference_mask(keep, segments)
    q, k, v = qkv(length=LENGTH, seed=3)
    if options.get("shared_qk"):
        inputs = (q, v)

        def fn(q, v):
            return kernel(q, q, v, **mask_kwargs(keep, segments))

        def reference(q, v):
            return padded_zero(shared_qk_reference(q, v, allowed), keep)
    else:
        inputs = (q, k, v)

        def fn(q, k, v):
            return kernel(q, k, v, **mask_kwargs(keep, segments))

        def reference(q, k, v):
            return padded_zero(dense_attention(q, k, v, allowed), keep)

    assert_same_outputs_and_grads(fn, reference, inputs)


STATE_CASES = [
    ("linear", {"causal": True}),
    ("linear", {"causal": False}),
    ("performer", {"causal": True, "seed": 0, "head_dim": 8}),
    ("performer", {"causal": False, "seed": 0, "head_dim": 8}),
    ("deltanet", {"chunk_size": 4}),
    ("deltanet", {"chunk_size": 4, "short_conv": 3, "n_heads": 3, "head_dim": 8}),
]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize(
    "name, options", STATE_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(STATE_CASES)]
)
def test_state_variants_equal_each_document_run_alone(name, options, which):
    torch.manual_seed(0)
    kernel = variants.build_attention(name, **options).double().eval()
    keep, segments = _masks(which)
    q, k, v = qkv(length=LENGTH, seed=4)
    inputs = [q, k, v]
    if kernel.n_gates:  # DeltaNet's beta, drawn once for every position
        g = torch.Generator().manual_seed(5)
        inputs.append(torch.rand(*q.shape[:3], kernel.n_gates, generator=g, dtype=q.dtype))

    def fn(*x):
        gates = {"gates": x[3]} if kernel.n_gates else {}
        return kernel(*x[:3], **gates, **mask_kwargs(keep, segments))

    def alone(*x):
        gates = {"gates": x[3]} if kernel.n_gates else {}
        return kernel(*x[:3], **gates)

    def reference(*x):
        return each_document_alone(alone, x, keep, segments)

    assert_same_outputs_and_grads(fn, reference, inputs)


# --- compressed and Linformer: each document alone, written out from their definitions --------
COMPRESSED_CASES = [("mean", 4), ("mean", 5), ("max", 4), ("conv", 5)]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize(
    "method, factor", COMPRESSED_CASES, ids=[f"{m}-{f}" for m, f in COMPRESSED_CASES]
)
def test_compressed_equals_each_document_compressed_alone(method, factor, causal, which):
    """Blocks counted from each document's first real token: documents of 2 to 13 real tokens,
    mostly not a multiple of the factor. The convs' gradients too."""
    torch.manual_seed(0)
    kernel = variants.build_attention(
        "compressed", causal=causal, factor=factor, method=method, head_dim=8
    ).double()
    keep, segments = _masks(which)

    def fn(q, k, v):
        return kernel(q, k, v, **mask_kwargs(keep, segments))

    def reference(q, k, v):
        return each_document_alone(partial(compressed_reference, kernel), (q, k, v), keep, segments)

    assert_same_outputs_and_grads(
        fn, reference, qkv(length=LENGTH, seed=10), params=list(kernel.parameters())
    )


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("share", ["none", "kv"])
def test_linformer_zeroes_padding_and_projects_each_document_alone(share, which):
    """A document's positions (padded ones included, their keys and values zero) projected by
    the first n columns of E and F; the projections' gradients too (none at padded columns)."""
    torch.manual_seed(0)
    kernel = variants.build_attention(
        "linformer", k=6, share=share, n_heads=3, max_seq_len=32
    ).double()
    keep, segments = _masks(which)

    def projected(q, k, v, real):
        n = q.shape[2]
        key_proj = kernel.key_proj[:, :, :n]  # (H or 1, k, n)
        value_proj = key_proj if kernel.value_proj is None else kernel.value_proj[:, :, :n]
        real = real[:, None].to(k.dtype)  # (n, 1)
        return dense_attention(q, key_proj @ (k * real), value_proj @ (v * real))

    def fn(q, k, v):
        return kernel(q, k, v, **mask_kwargs(keep, segments))

    def reference(q, k, v):
        out = each_document_alone(projected, (q, k, v), keep, segments, with_padding=True)
        return padded_zero(out, keep)

    assert_same_outputs_and_grads(
        fn, reference, qkv(length=LENGTH, seed=11), params=list(kernel.parameters())
    )


# --- grouped KV heads: every variant against itself on repeated keys -------------------------
GQA_SHAPE = (1, 4, 64, 8)  # (B, H, L, D); k, v with 2 heads


def _gqa_cases():
    for name in variants.attention_names():
        spec = variants.attention_spec(name)
        causal = spec.causal_supported
        yield pytest.param(name, causal, id=name)


def _kernel(name, causal):
    spec = variants.attention_spec(name)
    model_options = {
        "causal": causal,
        "n_heads": GQA_SHAPE[1],
        "head_dim": GQA_SHAPE[3],
        "max_seq_len": GQA_SHAPE[2],
        "shared_qk": spec.shared_qk_required,
    }
    options = {k: v for k, v in model_options.items() if k in spec.model_options}
    if "seed" in spec.options:
        options["seed"] = 0
    torch.manual_seed(0)
    return Gated(variants.build_attention(name, **options)).double().eval()


@pytest.mark.parametrize("name, causal", list(_gqa_cases()))
def test_grouped_kv_heads_equal_the_kernel_on_repeated_keys(name, causal):
    kernel = _kernel(name, causal)
    batch, heads, length, dim = GQA_SHAPE
    q, _, _ = qkv(batch, heads, length, dim, seed=6)
    _, k, v = qkv(batch, 2, length, dim, seed=7)
    if not variants.attention_spec(name).supports_gqa:
        with pytest.raises(UnsupportedCombination, match=f"{name}.*'n_kv_heads'"):
            kernel(q, k, v)
        return
    assert_grouped_equals_repeated(kernel, q, k, v)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_full_decodes_grouped_heads_from_a_cache_of_kv_heads(impl):
    kernel = variants.build_attention("full", causal=True, impl=impl)
    q, _, _ = qkv(1, 4, 10, 8, seed=8)
    _, k, v = qkv(1, 2, 10, 8, seed=9)
    cache = kernel.init_cache(1, 4, 8, max_len=10, dtype=q.dtype, n_kv_heads=2)
    assert cache.keys_buffer.shape[1] == 2  # the cache holds the KV heads only
    got = prefill_then_decode(kernel, q, k, v, cache, 6)
    torch.testing.assert_close(got, kernel(q, k, v))


def _repeating_decoder():
    """A variant whose decode takes grouped heads by repeating them into its cache, if any."""
    for name in variants.attention_names():
        cls = variants.attention_spec(name).cls
        if (
            cls.supports_decode
            and cls.decode_matches_forward
            and cls.supports_gqa
            and not cls.native_gqa_decode
        ):
            return name
    return None


def test_a_variant_without_native_decode_gqa_repeats_into_its_cache():
    name = _repeating_decoder()
    if name is None:
        pytest.skip("every decoding variant holds grouped heads natively")
    spec = variants.attention_spec(name)
    shape = {"n_heads": 4, "head_dim": 8, "max_seq_len": 8}
    kernel = variants.build_attention(
        name, causal=True, **{k: v for k, v in shape.items() if k in spec.model_options}
    )
    q, _, _ = qkv(1, 4, 8, 8, seed=8)
    _, k, v = qkv(1, 2, 8, 8, seed=9)
    gates = torch.randn(1, 4, 8, spec.n_gates, generator=torch.Generator().manual_seed(3))
    gates = gates.double() if spec.n_gates else None
    cache = kernel.init_cache(1, 4, 8, max_len=8, dtype=q.dtype, n_kv_heads=2)
    got = prefill_then_decode(kernel, q, k, v, cache, 5, gates)
    torch.testing.assert_close(got, kernel(q, k, v, gates=gates))


# --- refusals and checks ----------------------------------------------------------------------
def _refusing(flag):
    return [n for n in variants.attention_names() if not getattr(variants.attention_spec(n), flag)]


@pytest.mark.parametrize(
    "option, flag",
    [("attention_mask", "supports_padding_mask"), ("segment_ids", "supports_segments")],
)
def test_unsupported_masks_raise_naming_variant_and_option(option, flag):
    keep, segments = padding_and_documents(batch=1, length=64)
    given = {"attention_mask": keep, "segment_ids": segments}[option]
    q, k, v = qkv(1, 4, 64, 8)
    for name in _refusing(flag):
        kernel = _kernel(name, variants.attention_spec(name).causal_supported)
        variant = variants.attention_spec(name).variant  # a preset's kernel says its variant
        with pytest.raises(
            UnsupportedCombination, match=f"attention '{variant}'.*'{option}': "
        ) as e:
            kernel(q, k, v, **{option: given})
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["blockwise", "strided", "bigbird"])
def test_flex_refuses_masks_until_it_takes_them(name):
    q, k, v = qkv(length=16)
    kernel = variants.build_attention(name, impl="flex")
    with pytest.raises(UnsupportedCombination, match="'attention_mask': impl='flex'"):
        kernel(q, k, v, attention_mask=torch.ones(2, 16, dtype=torch.bool))


@pytest.mark.parametrize(
    "mask",
    [
        torch.ones(2, 16),  # float, not bool
        torch.ones(2, 15, dtype=torch.bool),  # wrong length
        torch.ones(16, dtype=torch.bool),  # no batch
    ],
    ids=["float", "length", "no-batch"],
)
def test_a_bad_attention_mask_is_a_value_error_naming_it(mask):
    q, k, v = qkv(length=16)
    with pytest.raises(ValueError, match="full: option 'attention_mask' must be a bool") as e:
        variants.build_attention("full")(q, k, v, attention_mask=mask)
    assert not isinstance(e.value, UnsupportedCombination)
    assert "True = a real token" in str(e.value)


def test_bad_segment_ids_are_value_errors_naming_them():
    q, k, v = qkv(length=4)
    kernel = variants.build_attention("full")
    with pytest.raises(ValueError, match="'segment_ids' must be an integer tensor"):
        kernel(q, k, v, segment_ids=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="'segment_ids' must be non-decreasing"):
        kernel(q, k, v, segment_ids=torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]]))


def test_kv_heads_must_divide_the_query_heads():
    q, _, _ = qkv(1, 3, 8, 4)
    _, k, v = qkv(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"k and v's heads \(2\) must divide q's heads \(3\)"):
        variants.build_attention("full")(q, k, v)


def test_masks_that_mask_nothing_change_nothing():
    q, k, v = qkv(length=16)
    kernel = variants.build_attention("blockwise", causal=True, block_size=4)
    plain = kernel(q, k, v)
    masked = kernel(
        q,
        k,
        v,
        attention_mask=torch.ones(2, 16, dtype=torch.bool),
        segment_ids=torch.zeros(2, 16, dtype=torch.int64),
    )
    torch.testing.assert_close(masked, plain)


# --- padded positions: never read, whatever they hold -----------------------------------------
PADDED_SHAPE = (2, 2, 96, 16)  # (B, H, L, D); row 1's last PADDED_TAIL positions padded
PADDED_TAIL = 20
# Options that cut PADDED_SHAPE's length into several blocks (buckets, clusters, windows), so
# that padded keys share blocks, chunks and summaries with real ones.
SEVERAL_BLOCKS = {
    "blockwise": {"block_size": 16},
    "combined": {"block_size": 16, "seed": 0},
    "longformer": {"block_size": 16},
    "bigbird": {"block_size": 16, "n_global": 8, "seed": 0},
    "sparse_fixed": {"block_size": 16, "n_summary": 4},
    "lsh": {"bucket_size": 16, "seed": 0},
    "routing": {"n_clusters": 4, "window": 16, "seed": 0},
    "linformer": {"k": 16},
    "performer": {"seed": 0},
    "moba": {"block_size": 16, "top_k": 2},
    "nsa": {"block_size": 16, "n_select": 2, "window": 32},
    "deltanet": {"chunk_size": 16, "short_conv": 3},
}


def padding_cases(padding=True):
    """(name, causal) of every variant in each direction it runs; `padding`: only those that
    take a key padding mask."""
    for name in variants.attention_names():
        spec = variants.attention_spec(name)
        if padding and not spec.supports_padding_mask:
            continue
        for causal in (False, True):
            if spec.causal_supported if causal else spec.bidirectional_supported:
                yield pytest.param(name, causal, id=f"{name}-{'causal' if causal else 'bidir'}")


@pytest.mark.parametrize("fill", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name, causal", list(padding_cases()))
def test_padded_positions_values_never_reach_real_outputs(name, causal, fill):
    """NaN or inf in q, k, v and the gates at padded positions: the outputs and the gradients
    (of q, k, v, gates and the kernel's parameters) are bit for bit those of zeros there,
    hence finite; padded keys share blocks with real ones."""
    spec = variants.attention_spec(name)
    batch, heads, length, dim = PADDED_SHAPE
    kernel = _several_blocks_kernel(name, causal)
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[1, -PADDED_TAIL:] = False
    q, k, v = qkv(batch, heads, length, dim, seed=16)
    gates = sample_gates(kernel, q, torch.Generator().manual_seed(17))
    inputs = [q, k, v] + ([] if gates is None else [gates])
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(18), dtype=q.dtype)
    params = list(kernel.parameters())

    def run(value):
        xs = [x.masked_fill(~keep[:, None, :, None], value).requires_grad_() for x in inputs]
        keys = xs[0] if spec.shared_qk_required else xs[1]  # the layer's k = q
        extra = {} if gates is None else {"gates": xs[3]}
        out = kernel(xs[0], keys, xs[2], **extra, attention_mask=keep)
        grads = torch.autograd.grad((out * weight).sum(), [*xs, *params], allow_unused=True)
        return out, [g for g in grads if g is not None]

    out, grads = run(fill)
    expected, expected_grads = run(0.0)
    assert torch.isfinite(expected).all()
    assert torch.equal(out, expected)
    assert len(grads) == len(expected_grads)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert torch.isfinite(expected_grad).all()
        assert torch.equal(grad, expected_grad)


def _several_blocks_kernel(name, causal):
    """`name` sized for PADDED_SHAPE with SEVERAL_BLOCKS' options, float64, in eval mode."""
    spec = variants.attention_spec(name)
    _, heads, length, dim = PADDED_SHAPE
    sizes = {"causal": causal, "n_heads": heads, "head_dim": dim, "max_seq_len": length}
    options = {k: v for k, v in sizes.items() if k in spec.model_options}
    torch.manual_seed(0)
    kernel = variants.build_attention(name, **options, **SEVERAL_BLOCKS.get(name, {}))
    return kernel.double().eval()


@pytest.mark.parametrize("name, causal", list(padding_cases(padding=False)))
def test_a_nan_in_a_real_token_stays_in_its_sequence(name, causal):
    """A NaN in q, k, v (and gates) of one real token of sequence 0 leaves sequence 1's outputs
    as they were. (Within sequence 0 it may reach positions that do not attend it: masked
    products multiply it by probability 0, `Attention.forward`.)"""
    spec = variants.attention_spec(name)
    kernel = _several_blocks_kernel(name, causal)
    q, k, v = qkv(*PADDED_SHAPE, seed=19)
    gates = sample_gates(kernel, q, torch.Generator().manual_seed(20))
    inputs = [q, k, v] + ([] if gates is None else [gates])

    def run(xs):
        keys = xs[0] if spec.shared_qk_required else xs[1]
        return kernel(xs[0], keys, xs[2], **({} if gates is None else {"gates": xs[3]}))

    expected = run(inputs)
    poisoned = [x.clone() for x in inputs]
    for x in poisoned:
        x[0, :, 40] = float("nan")
    out = run(poisoned)
    assert not torch.isfinite(out[0]).all()
    assert torch.equal(out[1], expected[1])


# --- block-selection variants (MoBA, NSA): per-query references of the masked rules ----------
def _real_and_documents(keep, segments, batch):
    """keep and segments as tensors (B, L) even where not given: all real, one document."""
    real = torch.ones(batch, LENGTH, dtype=torch.bool) if keep is None else keep
    docs = torch.zeros(batch, LENGTH, dtype=torch.int64) if segments is None else segments
    return real, docs


def moba_document_mask(q, k, block, top_k, causal, keep, segments):
    """(B, H, L, L) bool: MoBA's keys per query under masks, written from the rule: query i
    scores each candidate block (causal: before its own; else every other) by q_i . (mean of
    the block's real keys of i's document), skips blocks with none, keeps the top_k - 1 and
    its own block (causal: up to i); every pair then passes the padding / document mask."""
    batch, heads, length, _ = q.shape
    real, docs = _real_and_documents(keep, segments, batch)
    n_blocks = -(-length // block)
    mask = torch.zeros(batch, heads, length, length, dtype=torch.bool)
    for b in range(batch):
        for i in range(length):
            own = i // block
            same = real[b] & (docs[b] == docs[b, i])  # (L,) real keys of i's document
            pieces = {}
            for c in range(n_blocks):
                if c < own if causal else c != own:
                    keys = [j for j in range(c * block, min((c + 1) * block, length)) if same[j]]
                    if keys:
                        pieces[c] = keys
            for h in range(heads):
                scores = {
                    c: float(q[b, h, i] @ k[b, h, keys].mean(dim=0)) for c, keys in pieces.items()
                }
                for c in sorted(scores, key=scores.get, reverse=True)[: top_k - 1]:
                    mask[b, h, i, c * block : (c + 1) * block] = True
                end = i + 1 if causal else (own + 1) * block
                mask[b, h, i, own * block : end] = True
    return mask & document_reference_mask(keep, segments)


MOBA_CASES = [
    {"block_size": 4, "top_k": 3},
    {"block_size": 5, "top_k": 2},
    {"block_size": 7, "top_k": 4},
]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("options", MOBA_CASES, ids=lambda o: f"b{o['block_size']}-k{o['top_k']}")
def test_moba_matches_a_per_query_masked_reference(options, causal, which, flash_kernels):
    keep, segments = _masks(which)
    _assert_moba_matches_its_reference(options, causal, keep, segments, seed=10)


def _assert_moba_matches_its_reference(options, causal, keep, segments, seed):
    """MoBA with `options` under `keep` / `segments`: the outputs and gradients of the dense
    per-query reference (`moba_document_mask`), padded queries zero."""
    kernel = variants.build_attention("moba", causal=causal, **options)
    q, k, v = qkv(length=LENGTH, seed=seed)
    allowed = moba_document_mask(
        q, k, options["block_size"], options["top_k"], causal, keep, segments
    )

    def fn(q, k, v):
        return kernel(q, k, v, **mask_kwargs(keep, segments))

    def reference(q, k, v):
        return padded_zero(dense_attention(q, k, v, allowed), keep)

    assert_same_outputs_and_grads(fn, reference, (q, k, v))


def _moba_padding(layout):
    """(2, LENGTH) keep masks (True = real) that the MoBA tests below run: a tail padded in
    every sequence (cut off before the kernel) or not, padding inside a sequence, rows of
    unequal real lengths, a row padded throughout."""
    keep = torch.ones(2, LENGTH, dtype=torch.bool)
    if layout == "ragged-tail":  # both tails padded, unequal: the prefix keeps row 0's padding
        keep[0, 15:], keep[1, 20:] = False, False
    elif layout == "middle":  # no tail: only padding inside, a different run in each row
        keep[0, 6:11], keep[1, 13:17] = False, False
    elif layout == "middle-and-tail":
        keep[0, 4:9], keep[0, 18:], keep[1, 10:12], keep[1, 21:] = False, False, False, False
    elif layout == "even-tail":  # the same real length in both rows: the prefix has no padding
        keep[:, 17:] = False
    elif layout == "padded-row":  # row 1 has no real token
        keep[0, 19:], keep[1] = False, False
    return keep


MOBA_PADDING = ["ragged-tail", "middle", "middle-and-tail", "even-tail", "padded-row"]


@pytest.mark.parametrize("small_tiles", [False, True], ids=["tiles", "small-tiles"])
@pytest.mark.parametrize("documents", [False, True], ids=["padding", "padding-documents"])
@pytest.mark.parametrize("layout", MOBA_PADDING)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("options", MOBA_CASES, ids=lambda o: f"b{o['block_size']}-k{o['top_k']}")
def test_moba_padding_anywhere_matches_the_per_query_reference(
    options, causal, layout, documents, small_tiles, flash_kernels, monkeypatch
):
    """MoBA's shortcuts under padding (a tail padded in every sequence run as the real prefix
    alone, padded queries selecting no block, clean tiles and own blocks without a bias) give
    the outputs and gradients of the rule, wherever the padding lies. small_tiles: tiles of
    two rows in chunks of at most two tiles, so that clean and masked tiles meet in chunks."""
    if small_tiles:
        monkeypatch.setattr(selected_blocks, "TILE_ROWS", 2)
        monkeypatch.setattr(selected_blocks, "CHUNK_BYTES", 2 * (2 * 7 + 2 * 2) * 8 * 8)
    keep = _moba_padding(layout)
    segments = padding_and_documents(length=LENGTH)[1] if documents else None
    _assert_moba_matches_its_reference(options, causal, keep, segments, seed=11)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_moba_masks_that_mask_nothing_are_the_call_without_masks(causal):
    """Every token real and one document per sequence: bit for bit the call without masks;
    so is the real prefix of a tail padded in every sequence (the rest zeros)."""
    kernel = variants.build_attention("moba", causal=causal, block_size=4, top_k=3)
    q, k, v = qkv(length=LENGTH, seed=12)
    nothing = {
        "attention_mask": torch.ones(2, LENGTH, dtype=torch.bool),
        "segment_ids": torch.full((2, LENGTH), 3, dtype=torch.int64),
    }
    assert torch.equal(kernel(q, k, v, **nothing), kernel(q, k, v))
    keep = torch.arange(LENGTH) < 17
    out = kernel(q, k, v, attention_mask=keep.expand(2, -1))
    assert torch.equal(out[:, :, :17], kernel(q[:, :, :17], k[:, :, :17], v[:, :, :17]))
    assert not out[:, :, 17:].any()


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_selected_blocks_mask_a_clean_block_of_another_document(causal, flash_kernels):
    """`SelectedBlocks` given a selection no routing of MoBA makes: queries pick a clean
    block (all real, one document) of another document. Its keys stay hidden from them (the
    part weighs 0), as the per-pair mask says: a tile is only bias-free when its queries
    are of its block's document."""
    q, k, v = qkv(batch=1, heads=2, length=16, seed=14)
    segments = (torch.arange(16) >= 8).long()[None]  # documents [0, 8) and [8, 16)
    selected = torch.full((1, 2, 16, 2), -1, dtype=torch.long)
    selected[:, :, 8:, 0] = 0  # document 1's queries pick block 0 (document 0's) ...
    selected[:, :, 8:, 1] = 1  # ... and block 1, also document 0's
    if not causal:
        selected[:, :, :8, 0] = 3  # document 0's queries pick block 3 (document 1's)
    allowed = torch.zeros(1, 2, 16, 16, dtype=torch.bool)
    for i in range(16):
        own = i // 4
        allowed[:, :, i, own * 4 : (i + 1 if causal else own * 4 + 4)] = True
        for h in range(2):
            for c in selected[0, h, i].tolist():
                if c >= 0:
                    allowed[0, h, i, c * 4 : c * 4 + 4] = True
    allowed &= document_reference_mask(None, segments)

    def fn(q, k, v):
        return selected_blocks.SelectedBlocks.apply(q, k, v, selected, 4, causal, None, segments)

    def reference(q, k, v):
        return dense_attention(q, k, v, allowed)

    assert_same_outputs_and_grads(fn, reference, (q, k, v))


def test_moba_block_aligned_documents_need_no_bias():
    """Documents that start and end at block edges: every tile and own block is clean, so
    the masked call runs the fused kernels as the call without masks does (no bias)."""
    q, k, v = qkv(batch=1, length=32, seed=13)
    segments = (torch.arange(32) // 8)[None]  # 4 documents of two blocks of 4
    kernel = variants.build_attention("moba", causal=True, block_size=4, top_k=3)
    selected = kernel.selection(q, k, segment_ids=segments)
    plan = selected_blocks._Plan(q, k.shape[1], selected, 4, True, None, segments)
    assert plan.n_tiles > 0 and plan.n_clean == plan.n_tiles
    assert bool(plan.own_clean.all())
    assert plan._own_parts(q.dtype, q.device) == [(None, None, True)]


def nsa_document_reference(q, k, v, gates, options, compress, keep, segments):
    """NSA under masks, per query, written from the rules: compressed over the ended blocks
    lying wholly in the query's document with a real key (`compress`: the keys' and the
    values' summaries, padding left out); selected over its own block and the n_select - 1 of
    those blocks (its own excluded) with the highest compressed score; window i - w < j <= i;
    the selected and window keys only where real (or i itself) and of i's document; gated
    sum, padded queries' rows 0."""
    block, n_select, window = options["block_size"], options["n_select"], options["window"]
    batch, heads, length, dim = q.shape
    real, docs = _real_and_documents(keep, segments, batch)
    ck, cv = compress[0](k), compress[1](v)  # (B, H, n, D)
    out = torch.zeros_like(q)
    for b in range(batch):
        for i in range(length):
            doc, own = docs[b, i], i // block
            may = real[b] & (docs[b] == doc)
            may[i] = True  # a query keeps its own key
            readable = [
                c
                for c in range(ck.shape[2])
                if (c + 1) * block - 1 <= i
                and bool((docs[b, c * block : (c + 1) * block] == doc).all())
                and bool(real[b, c * block : (c + 1) * block].any())
            ]
            for h in range(heads):
                qi = q[b, h, i]
                o_cmp = torch.zeros_like(qi)
                scores = {}
                if readable:
                    s = torch.stack([qi @ ck[b, h, c] for c in readable]) * dim**-0.5
                    o_cmp = torch.softmax(s, dim=0) @ cv[b, h, readable]
                    scores = {c: float(s[n].detach()) for n, c in enumerate(readable) if c != own}
                chosen = sorted(scores, key=scores.get, reverse=True)[: n_select - 1]
                keys = [j for c in chosen for j in range(c * block, (c + 1) * block)]
                keys = [j for j in keys + list(range(own * block, i + 1)) if may[j]]
                o_sel = dense_softmax_row(qi, k[b, h, keys], v[b, h, keys], dim**-0.5)
                keys = [j for j in range(max(0, i - window + 1), i + 1) if may[j]]
                o_win = dense_softmax_row(qi, k[b, h, keys], v[b, h, keys], dim**-0.5)
                g = gates[b, h, i]
                out[b, h, i] = g[0] * o_cmp + g[1] * o_sel + g[2] * o_win
    return padded_zero(out, keep)


def _real_summaries(kernel, block, keep):
    """The block summaries of keys and of values with padding left out, written out: the mean
    of each block's real positions, or the module's MLPs on the inputs with padded positions
    zeroed."""
    weight = None if keep is None else keep[:, None, :, None].to(torch.float64)

    def mean(x):
        w = torch.ones_like(x[..., :1]) if weight is None else weight
        starts = range(0, x.shape[2], block)
        sums = [(x * w)[:, :, s : s + block].sum(dim=2) for s in starts]
        counts = [w[:, :, s : s + block].sum(dim=2).clamp(min=1) for s in starts]
        return torch.stack([s / c for s, c in zip(sums, counts, strict=True)], dim=2)

    def mlp(module):
        return lambda x: mlp_blocks(module, block)(x if weight is None else x * weight)

    if kernel.compress == "mean":
        return mean, mean
    return mlp(kernel.key_mlp), mlp(kernel.value_mlp)


NSA_CASES = [
    {"block_size": 4, "n_select": 3, "window": 5},
    {"block_size": 5, "n_select": 2, "window": 7},  # L not a multiple of the block
]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("compress", ["mean", "mlp"])
@pytest.mark.parametrize("options", NSA_CASES, ids=lambda o: f"b{o['block_size']}")
def test_nsa_matches_a_per_query_masked_reference(options, compress, which, flash_kernels):
    torch.manual_seed(0)
    kernel = variants.build_attention("nsa", compress=compress, head_dim=8, **options).double()
    keep, segments = _masks(which)
    q, k, v = qkv(length=LENGTH, seed=11)
    gates = torch.rand(*q.shape[:3], 3, generator=torch.Generator().manual_seed(12), dtype=q.dtype)
    summaries = _real_summaries(kernel, options["block_size"], keep)

    def fn(q, k, v, gates):
        return kernel(q, k, v, gates=gates, **mask_kwargs(keep, segments))

    def reference(q, k, v, gates):
        return nsa_document_reference(q, k, v, gates, options, summaries, keep, segments)

    assert_same_outputs_and_grads(fn, reference, (q, k, v, gates))


@pytest.mark.parametrize("small_calls", [False, True], ids=["calls", "small-calls"])
@pytest.mark.parametrize("documents", [False, True], ids=["padding", "padding-documents"])
@pytest.mark.parametrize("layout", MOBA_PADDING)
@pytest.mark.parametrize("compress", ["mean", "mlp"])
@pytest.mark.parametrize("options", NSA_CASES, ids=lambda o: f"b{o['block_size']}")
def test_nsa_padding_anywhere_matches_the_per_query_reference(
    options, compress, layout, documents, small_calls, flash_kernels, monkeypatch
):
    """NSA's shortcuts under padding (a tail padded in every sequence run as the real prefix
    alone, padded queries selecting no block, compressed row ranges and window calls without
    a bias where no real query has a pair hidden, clean selected tiles) give the outputs and
    the gradients of q, k, v, the gates and the compression's parameters of the rule,
    wherever the padding lies. small_calls: compressed ranges of 3 rows, window tiles of 2
    rows one or two per call, selected tiles of 2 rows, so that calls with and without a bias
    meet in one forward."""
    if small_calls:
        monkeypatch.setattr(nsa_function, "ROWS", 3)
        monkeypatch.setattr(nsa_function, "WINDOW_ROWS", 2)
        monkeypatch.setattr(nsa_function, "WINDOW_CHUNK_BYTES", 2 * 2 * 3 * 10 * 8 * 8)
        monkeypatch.setattr(selected_blocks, "TILE_ROWS", 2)
        monkeypatch.setattr(selected_blocks, "CHUNK_BYTES", 2 * (2 * 5 + 2 * 2) * 8 * 8)
    torch.manual_seed(0)
    kernel = variants.build_attention("nsa", compress=compress, head_dim=8, **options).double()
    keep = _moba_padding(layout)
    segments = padding_and_documents(length=LENGTH)[1] if documents else None
    q, k, v = qkv(length=LENGTH, seed=11)
    gates = torch.rand(*q.shape[:3], 3, generator=torch.Generator().manual_seed(12), dtype=q.dtype)
    summaries = _real_summaries(kernel, options["block_size"], keep)

    def fn(q, k, v, gates):
        return kernel(q, k, v, gates=gates, **mask_kwargs(keep, segments))

    def reference(q, k, v, gates):
        return nsa_document_reference(q, k, v, gates, options, summaries, keep, segments)

    params = tuple(kernel.parameters())
    assert_same_outputs_and_grads(fn, reference, (q, k, v, gates), params=params)


@pytest.mark.parametrize("compress", ["mean", "mlp"])
def test_nsa_masks_that_mask_nothing_are_the_call_without_masks(compress):
    """Every token real and one document per sequence: bit for bit the call without masks,
    outputs and gradients (gates and the compression's parameters included); so is the real
    prefix of a tail padded in every sequence, the rest zeros with no gradient."""
    torch.manual_seed(0)
    options = {"block_size": 4, "n_select": 3, "window": 5}
    kernel = variants.build_attention("nsa", compress=compress, head_dim=8, **options).double()
    q, k, v = qkv(length=LENGTH, seed=12)
    gates = torch.rand(*q.shape[:3], 3, generator=torch.Generator().manual_seed(13), dtype=q.dtype)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(14), dtype=q.dtype)
    params = list(kernel.parameters())

    def run(length, **masks):
        inputs = [x[:, :, :length].detach().clone().requires_grad_() for x in (q, k, v, gates)]
        out = kernel(*inputs[:3], gates=inputs[3], **masks)
        grads = torch.autograd.grad((out * weight[:, :, :length]).sum(), [*inputs, *params])
        return out, grads

    nothing = {
        "attention_mask": torch.ones(2, LENGTH, dtype=torch.bool),
        "segment_ids": torch.full((2, LENGTH), 3, dtype=torch.int64),
    }
    out, grads = run(LENGTH)
    masked_out, masked_grads = run(LENGTH, **nothing)
    assert torch.equal(masked_out, out)
    assert all(torch.equal(a, b) for a, b in zip(masked_grads, grads, strict=True))
    keep = (torch.arange(LENGTH) < 17).expand(2, -1)
    out, grads = run(17)
    tail_out, tail_grads = run(LENGTH, attention_mask=keep)
    assert torch.equal(tail_out[:, :, :17], out) and not tail_out[:, :, 17:].any()
    for tail_grad, grad in zip(tail_grads[:4], grads[:4], strict=True):
        assert torch.equal(tail_grad[:, :, :17], grad) and not tail_grad[:, :, 17:].any()
    assert all(torch.equal(a, b) for a, b in zip(tail_grads[4:], grads[4:], strict=True))


def test_nsa_padding_of_padded_queries_only_needs_no_bias():
    """Ragged tails (row 0 padded from 15, row 1 real throughout): only padded queries would
    have a pair hidden, so the compressed row ranges and the window calls run without a
    bias, as without masks; padding inside row 1 is hidden from its real queries."""
    q = qkv(length=LENGTH, seed=15)[0]
    keep = torch.ones(2, LENGTH, dtype=torch.bool)
    keep[0, 15:] = False
    ranges = nsa_function._row_ranges(q, 4, DocumentBlocks(keep, None, LENGTH, 4))
    assert all(empty is None for _, _, _, empty in ranges)
    tiles = nsa_function._WindowTiles(q, 5, keep, None)
    assert all(call.bias.shape[:2] == (1, 1) for call in tiles.calls())
    keep[1, 4:8] = False  # a padded block inside row 1: hidden from its later real queries
    ranges = nsa_function._row_ranges(q, 4, DocumentBlocks(keep, None, LENGTH, 4))
    assert any(bias.shape[0] == 2 for _, _, bias, _ in ranges)
    tiles = nsa_function._WindowTiles(q, 5, keep, None)
    assert any(call.bias.shape[0] == 2 * 3 for call in tiles.calls())
