"""Combined patterns against dense attention over unions of hand-written part masks."""

import pytest
import torch

from tests.reference import (
    assert_causal,
    assert_grouped_equals_repeated,
    assert_layout_independent,
    block_table_rule,
    causal_rule,
    dense_attention,
    global_rule,
    local_rule,
    mask_kwargs,
    padding_and_documents,
    prefill_then_decode,
    qkv,
    rule_mask,
    strided_rule,
    summary_rule,
    union_rule,
)
from variants import patterns
from variants.attention.common import flash
from variants.registry import build_attention

# Part sets with their options; block sizes 4-5 so that the lengths below are not multiples.
CASES = {
    "local": {"parts": ["local"], "block_size": 4, "look_backward": 2, "look_forward": 1},
    "local+global": {"parts": ["local", "global"], "block_size": 4, "n_global": 3},
    "bigbird-like": {
        "parts": ["local", "global", "random"],
        "block_size": 4,
        "n_global": 4,
        "n_random": 2,
        "seed": 1,
    },
    "random": {"parts": ["random"], "block_size": 4, "n_random": 2, "seed": 3},
    "global": {"parts": ["global"], "block_size": 4, "n_global": 2},
    "strided": {"parts": ["strided"], "block_size": 4, "stride": 3},
    "local+strided+global": {
        "parts": ["local", "strided", "global"],
        "block_size": 5,
        "stride": 4,
        "n_global": 2,
    },
    "fixed-like": {
        "parts": ["local", "summary"],
        "block_size": 5,
        "look_backward": 0,
        "look_forward": 0,
        "n_summary": 2,
    },
    "summary+global+random": {
        "parts": ["summary", "global", "random"],
        "block_size": 4,
        "n_summary": 2,
        "n_random": 1,
        "seed": 0,
        "n_global": 5,
    },
}
LENGTHS = (23, 7)  # 23: several blocks and a ragged last one; 7: under two blocks


def hand_mask(kernel, options, length):
    """The union of the parts' hand-written masks (tests/reference.py), cut causally. Random
    blocks come from the kernel's draw, whose shape `test_patterns` checks."""
    b, causal = options["block_size"], kernel.causal
    rules = {
        "local": lambda: local_rule(
            b, options.get("look_backward", 1), 0 if causal else options.get("look_forward", 1)
        ),
        "strided": lambda: strided_rule(options["stride"]),
        "global": lambda: global_rule(options["n_global"], causal),
        "random": lambda: block_table_rule(
            kernel.part_patterns(length)["random"].blocks.tolist(), b
        ),
        "summary": lambda: summary_rule(b, options["n_summary"]),
    }
    mask = rule_mask(length, union_rule(*(rules[p]() for p in options["parts"])))
    return mask & rule_mask(length, causal_rule) if causal else mask


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_matches_dense_attention_over_the_union(case, causal, length):
    options = CASES[case]
    kernel = build_attention("combined", causal=causal, **options)
    q, k, v = qkv(length=length, seed=length)
    expected = dense_attention(q, k, v, hand_mask(kernel, options, length))
    torch.testing.assert_close(kernel(q, k, v), expected)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", ["bigbird-like", "local+strided+global", "fixed-like", "random"])
def test_gradients_match_dense_attention(case, causal, flash_kernels):
    options = CASES[case]
    kernel = build_attention("combined", causal=causal, **options)
    q, k, v = qkv(batch=1, heads=2, length=23, head_dim=4, seed=5, requires_grad=True)
    out = kernel(q, k, v)
    expected = dense_attention(q, k, v, hand_mask(kernel, options, 23))
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in got)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("causal", [False, True])
def test_a_pair_allowed_by_several_parts_counts_once(causal):
    # Global keys inside the local window, strided keys inside it and the query itself in
    # every part: dense attention over the union, not over the sum of the parts.
    options = CASES["local+strided+global"]
    kernel = build_attention("combined", causal=causal, **options)
    q, k, v = qkv(length=23, seed=9)
    b = options["block_size"]
    rules = (local_rule(b, 1, 0 if causal else 1), strided_rule(4), global_rule(2, causal))
    multiplicity = sum(rule_mask(23, r).double() for r in rules)
    if causal:
        multiplicity = multiplicity * rule_mask(23, causal_rule)
    assert multiplicity.max() == 3  # the parts do overlap
    union = multiplicity > 0
    out = kernel(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, union))
    scores = (q @ k.transpose(-1, -2)) * 8**-0.5 + multiplicity.clamp_min(1e-300).log()
    summed = torch.softmax(scores, dim=-1) @ v  # each pair weighted by its part count
    assert not torch.allclose(out, summed)


@pytest.mark.parametrize("case", CASES)
def test_pieces_partition_the_pattern(case):
    # The tiles, strided and summary pieces are disjoint and together the pattern (in the
    # global rows, which a dense piece of their own replaces, only the pattern matters).
    for causal in (False, True):
        kernel = build_attention("combined", causal=causal, **CASES[case])
        plan = kernel.plan(23)
        masks = [piece.dense(23) for piece in plan.pieces.values()]
        rows = slice(plan.global_rows, None)
        assert int(sum(m.int() for m in masks)[rows].max()) <= 1
        union = torch.stack(masks).any(0)
        assert torch.equal(union[rows], kernel.pattern(23).dense(23)[rows])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_flops_count_the_allowed_pairs(case, causal):
    options = CASES[case]
    kernel = build_attention("combined", causal=causal, **options)
    for length in LENGTHS:
        allowed = int(hand_mask(kernel, options, length).sum())
        assert kernel.flops(2, 3, length, 8) == 4 * 2 * 3 * allowed * 8


@pytest.mark.parametrize("name", ["longformer", "bigbird", "sparse_fixed"])
def test_presets_flops_count_their_pattern_at_length(name):
    kernel = build_attention(name, causal=True, seed=0)
    length = 700  # several blocks of 64 and 128, and a ragged last one
    assert kernel.flops(1, 1, length, 1) == 4 * kernel.pattern(length).pairs(length, 64)


@pytest.mark.parametrize("name", ["longformer", "bigbird", "sparse_fixed"])
def test_presets_never_see_the_future(name):
    kernel = build_attention(name, causal=True, block_size=4, n_global=2, n_summary=2, seed=0)
    assert_causal(kernel, length=40, t=17)


@pytest.mark.parametrize("case", ["bigbird-like", "local+strided+global", "fixed-like"])
def test_causal_part_sets_never_see_the_future(case):
    assert_causal(build_attention("combined", causal=True, **CASES[case]), length=30, t=13)


def test_rows_without_any_key_are_zero_with_zero_gradients():
    # Causal random blocks alone: the first block has no earlier block to draw.
    kernel = build_attention("combined", causal=True, **CASES["random"])
    q, k, v = qkv(batch=1, heads=1, length=23, seed=2, requires_grad=True)
    out = kernel(q, k, v)
    assert torch.equal(out[:, :, :4], torch.zeros_like(out[:, :, :4]))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.equal(grads[0][:, :, :4], torch.zeros_like(grads[0][:, :, :4]))


def test_random_blocks_are_reproducible_by_seed_and_fixed_per_layer():
    options = {"parts": ["random", "local"], "block_size": 4, "n_random": 2, "max_seq_len": 40}
    q, k, v = qkv(length=40, seed=4)
    seeded = [build_attention("combined", seed=5, **options) for _ in range(2)]
    torch.testing.assert_close(seeded[0](q, k, v), seeded[1](q, k, v))
    torch.manual_seed(0)
    first, second = (build_attention("combined", **options) for _ in range(2))
    assert not torch.equal(first.pattern(40).dense(40), second.pattern(40).dense(40))
    torch.testing.assert_close(first(q, k, v), first(q, k, v))  # fixed across calls
    torch.manual_seed(0)  # the same model seed draws the same layers again
    assert torch.equal(
        build_attention("combined", **options).pattern(40).dense(40), first.pattern(40).dense(40)
    )


def test_the_tile_lists_stay_sparse_at_length():
    # BigBird at 4K: per query block at most its window, the global block and 3 random blocks,
    # so the gathered keys and their mask are O(L), never (L, L).
    plan = build_attention("bigbird", causal=False, seed=0).plan(4096)
    assert plan.tiles.shape == (64, 7)
    assert plan.hidden.numel() == 4096 * 7 * 64
    assert plan.global_rows == 64  # the global block's rows: a piece of their own


@pytest.mark.parametrize("causal", [False, True])
def test_strided_inputs_give_the_contiguous_result(causal):
    kernel = build_attention("combined", causal=causal, **CASES["local+strided+global"])
    assert_layout_independent(kernel, qkv(batch=1, heads=3, length=22, head_dim=4, seed=4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_stays_finite(dtype, flash_kernels):
    kernel = build_attention("combined", causal=True, **CASES["random"])  # with empty rows
    q, k, v = qkv(batch=1, heads=2, length=23, head_dim=8, seed=3)
    out = kernel(*(x.to(dtype) for x in (q, k, v)))
    assert torch.isfinite(out).all()
    expected = dense_attention(q, k, v, hand_mask(kernel, CASES["random"], 23))
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


# Eager FlexAttention spends about a second on each new block mask: few cases.
@pytest.mark.parametrize(
    "name, causal, options",
    [
        ("bigbird", True, {"block_size": 4, "n_global": 4, "n_random": 2, "seed": 0}),
        ("longformer", False, {"block_size": 4, "n_global": 2}),
        ("sparse_fixed", True, {"block_size": 5, "n_summary": 2}),
    ],
)
def test_flex_forward_equals_the_native_kernel(name, causal, options, eager_flex):
    q, k, v = qkv(batch=1, heads=2, length=23, seed=6)
    native = build_attention(name, causal=causal, **options)(q, k, v)
    flex = build_attention(name, causal=causal, impl="flex", **options)(q, k, v)
    torch.testing.assert_close(flex, native)


def test_flex_refuses_to_train_on_cpu():
    q, k, v = qkv(batch=1, heads=1, length=8, requires_grad=True)
    kernel = build_attention("bigbird", impl="flex")
    assert not kernel.supports_backward(torch.device("cpu"))
    with pytest.raises(ValueError, match="combined: option impl='flex' runs forward only on CPU"):
        kernel(q, k, v)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"parts": []}, "option 'parts' must be a non-empty list of local, strided"),
        ({"parts": "local"}, "option 'parts' must be a non-empty list"),
        ({"parts": ["local", "dilated"]}, "option 'parts' may hold local, .*; got 'dilated'"),
        ({"parts": ["local", "local"]}, "option 'parts' names a part twice"),
        (
            {"parts": ["strided", "summary"]},
            "option 'parts' cannot hold both 'strided' and 'summary'",
        ),
        ({"block_size": 0}, "option 'block_size' must be a positive integer, got 0"),
        ({"n_random": 0}, "option 'n_random' must be a positive integer"),
        ({"stride": "sqrt"}, "option 'stride' must be a positive integer or 'auto'"),
        (
            {"parts": ["summary"], "n_summary": 70},
            "option 'n_summary'=70 must be at most 'block_size'=64",
        ),
        ({"seed": -1}, "option 'seed' must be a non-negative integer"),
        ({"impl": "triton"}, "option 'impl' must be one of native, flex"),
    ],
)
def test_bad_options_are_rejected_by_name(options, message):
    with pytest.raises(ValueError, match=f"combined: {message}"):
        build_attention("combined", **options)


def test_tile_states_drive_which_blocks_are_gathered():
    # Only tiles the pattern needs are listed; FULL tiles carry no hidden key.
    kernel = build_attention("combined", causal=True, parts=["local"], block_size=4)
    plan = kernel.plan(16)
    assert plan.tiles.tolist() == [[0, 0], [0, 1], [1, 2], [2, 3]]
    assert plan.kinds.tolist() == [
        [patterns.PARTIAL, patterns.EMPTY],
        *[[patterns.FULL, patterns.PARTIAL]] * 3,
    ]
    assert int(plan.hidden[1, :, :4].sum()) == 0  # the full previous block: nothing hidden
    assert flash.masked_score(torch.float32) < 0


# --- grouped KV heads: the same kernel on keys repeated to the query heads --------------------
# (kv_heads of 4 query heads, masks, batch): groups of 2 and 4, each mask, batch 1 and 2 (the
# tiles run one sequence per call when grouped, the columns fold the batch in).
GROUPED = [(2, "none", 1), (2, "both", 2), (1, "padding", 2), (1, "segments", 1)]


@pytest.mark.parametrize("kv_heads, masks, batch", GROUPED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_grouped_heads_equal_the_kernel_on_repeated_keys(
    case, causal, kv_heads, masks, batch, flash_kernels
):
    keep, segments = padding_and_documents(batch=batch, length=23, seed=4)
    given = mask_kwargs(
        keep if masks in ("padding", "both") else None,
        segments if masks in ("segments", "both") else None,
    )
    kernel = build_attention("combined", causal=causal, **CASES[case])
    q, _, _ = qkv(batch=batch, heads=4, length=23, seed=5)
    _, k, v = qkv(batch=batch, heads=kv_heads, length=23, seed=6)
    assert_grouped_equals_repeated(kernel, q, k, v, given)


@pytest.mark.parametrize("name", ["longformer", "bigbird", "sparse_fixed"])
def test_presets_take_grouped_heads(name, flash_kernels):
    kernel = build_attention(name, causal=True, block_size=32)  # sparse_fixed: n_summary 32
    q, _, _ = qkv(batch=2, heads=4, length=80, seed=1)
    _, k, v = qkv(batch=2, heads=2, length=80, seed=2)
    assert_grouped_equals_repeated(kernel, q, k, v)


@pytest.mark.parametrize("case", ["bigbird-like", "local+strided+global", "fixed-like"])
def test_decodes_grouped_heads_from_a_cache_of_kv_heads(case):
    kernel = build_attention("combined", causal=True, **CASES[case])
    q, _, _ = qkv(batch=2, heads=4, length=23, seed=8)
    _, k, v = qkv(batch=2, heads=2, length=23, seed=9)
    cache = kernel.init_cache(2, 4, q.shape[-1], max_len=23, dtype=q.dtype, n_kv_heads=2)
    got = prefill_then_decode(kernel, q, k, v, cache, 9)
    assert cache.ring_keys.shape[1] == cache.store_keys.shape[1] == 2  # the KV heads only
    torch.testing.assert_close(got, kernel(q, k, v))


def test_flex_forward_with_grouped_heads_equals_the_native_kernel(eager_flex):
    options = CASES["bigbird-like"]
    q, _, _ = qkv(batch=1, heads=4, length=20, seed=2)
    _, k, v = qkv(batch=1, heads=2, length=20, seed=3)
    native = build_attention("combined", causal=True, **options)(q, k, v)
    flex = build_attention("combined", causal=True, impl="flex", **options)(q, k, v)
    torch.testing.assert_close(flex, native)
