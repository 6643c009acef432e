"""The kernel contract's masks and grouped KV heads (`variants.attention.common.masking`), on every
variant that claims them: outputs and gradients against independent fp64 references.

- pattern variants: a dense (L, L) mask from the pattern and the padding / document mask
  (written out in `tests.reference`), plain softmax attention, padded query rows zeroed;
- state variants (linear, performer, deltanet): each document's real positions run alone,
  the outputs put back (padded rows zero);
- grouped KV heads: the same kernel on explicitly repeated k, v.

LSH and routing, whose pairs depend on their buckets and clusters, are tested in their own
modules against the same document mask.
"""

from __future__ import annotations

import pytest
import torch

import variants
from tests.reference import (
    Gated,
    assert_same_outputs_and_grads,
    causal_mask,
    dense_attention,
    document_reference_mask,
    mask_kwargs,
    padded_zero,
    padding_and_documents,
    qkv,
    shared_qk_reference,
)
from variants.checks import UnsupportedCombination

MASKS = ["padding", "documents", "both"]
LENGTH = 24


def _masks(which):
    keep, segments = padding_and_documents(length=LENGTH)
    return (None if which == "documents" else keep), (None if which == "padding" else segments)


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
]


@pytest.mark.parametrize("which", MASKS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize(
    "name, options",
    PATTERN_CASES,
    ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in PATTERN_CASES],
)
def test_pattern_variants_match_a_dense_masked_reference(name, options, causal, which):
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

    def reference(*x):
        out = torch.zeros_like(x[0])
        for b in range(q.shape[0]):
            ids = torch.zeros(LENGTH, dtype=torch.int64) if segments is None else segments[b]
            real = torch.ones(LENGTH, dtype=torch.bool) if keep is None else keep[b]
            for doc in ids.unique():
                where = ((ids == doc) & real).nonzero().squeeze(-1)
                if len(where):
                    one = [t[b : b + 1, :, where] for t in x]
                    gates = {"gates": one[3]} if kernel.n_gates else {}
                    out[b : b + 1, :, where] = kernel(*one[:3], **gates)
        return out

    assert_same_outputs_and_grads(fn, reference, inputs)


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

    def repeated(q, k, v):
        return kernel(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))

    assert_same_outputs_and_grads(kernel, repeated, (q, k, v))


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_full_decodes_grouped_heads_from_a_cache_of_kv_heads(impl):
    kernel = variants.build_attention("full", causal=True, impl=impl)
    q, _, _ = qkv(1, 4, 10, 8, seed=8)
    _, k, v = qkv(1, 2, 10, 8, seed=9)
    cache = kernel.init_cache(1, 4, 8, max_len=10, dtype=q.dtype, n_kv_heads=2)
    assert cache.keys_buffer.shape[1] == 2  # the cache holds the KV heads only
    prompt = kernel.prefill(q[:, :, :6], k[:, :, :6], v[:, :, :6], cache)
    steps = [
        kernel.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], cache)
        for t in range(6, 10)
    ]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=2), kernel(q, k, v))


def test_a_variant_without_native_decode_gqa_repeats_into_its_cache():
    kernel = variants.build_attention("blockwise", causal=True, block_size=4)
    q, _, _ = qkv(1, 4, 8, 8, seed=8)
    _, k, v = qkv(1, 2, 8, 8, seed=9)
    cache = kernel.init_cache(1, 4, 8, max_len=8, dtype=q.dtype, n_kv_heads=2)
    prompt = kernel.prefill(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache)
    steps = [
        kernel.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], cache)
        for t in range(5, 8)
    ]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=2), kernel(q, k, v))


# --- refusals and checks ----------------------------------------------------------------------
def _refusing(flag):
    return [n for n in variants.attention_names() if not getattr(variants.attention_spec(n), flag)]


@pytest.mark.parametrize(
    "option, flag",
    [("key_padding_mask", "supports_padding_mask"), ("segment_ids", "supports_segments")],
)
def test_unsupported_masks_raise_naming_variant_and_option(option, flag):
    keep, segments = padding_and_documents(batch=1, length=64)
    given = {"key_padding_mask": keep, "segment_ids": segments}[option]
    q, k, v = qkv(1, 4, 64, 8)
    for name in _refusing(flag):
        kernel = _kernel(name, variants.attention_spec(name).causal_supported)
        variant = variants.attention_spec(name).variant  # a preset's kernel says its variant
        with pytest.raises(
            UnsupportedCombination, match=f"attention '{variant}'.*'{option}': "
        ) as e:
            kernel(q, k, v, **{option: given})
        assert "\n" not in str(e.value)


def test_flex_refuses_masks_until_it_takes_them():
    q, k, v = qkv(length=16)
    kernel = variants.build_attention("blockwise", impl="flex", block_size=8)
    with pytest.raises(UnsupportedCombination, match="'key_padding_mask': impl='flex'"):
        kernel(q, k, v, key_padding_mask=torch.ones(2, 16, dtype=torch.bool))


@pytest.mark.parametrize(
    "mask",
    [
        torch.ones(2, 16),  # float, not bool
        torch.ones(2, 15, dtype=torch.bool),  # wrong length
        torch.ones(16, dtype=torch.bool),  # no batch
    ],
    ids=["float", "length", "no-batch"],
)
def test_a_bad_key_padding_mask_is_a_value_error_naming_it(mask):
    q, k, v = qkv(length=16)
    with pytest.raises(ValueError, match="full: option 'key_padding_mask' must be a bool") as e:
        variants.build_attention("full")(q, k, v, key_padding_mask=mask)
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
        key_padding_mask=torch.ones(2, 16, dtype=torch.bool),
        segment_ids=torch.zeros(2, 16, dtype=torch.int64),
    )
    torch.testing.assert_close(masked, plain)
