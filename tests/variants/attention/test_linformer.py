"""Linformer: exact with identity projections, sharing modes, its refusal of causal, its memory."""

from __future__ import annotations

import pytest
import torch

from tests.reference import (
    assert_grouped_equals_repeated,
    dense_attention,
    mask_kwargs,
    padding_and_documents,
    qkv,
)
from variants import build_attention
from variants.registry import attention_spec


def build(**options):
    options = {"k": 16, "n_heads": 3, "max_seq_len": 16, **options}
    return build_attention("linformer", **options).double()


def set_identity_columns(module, length):
    """E = F = [I_L | anything]: the projected keys and values are the keys and values."""
    with torch.no_grad():
        for proj in (module.key_proj, module.value_proj):
            if proj is not None:
                proj[:, :, :length] = torch.eye(length)


@pytest.mark.parametrize("share", ["none", "headwise", "kv"])
def test_identity_projections_with_k_equal_to_length_are_full_attention(share):
    module = build(share=share)
    set_identity_columns(module, 16)
    q, k, v = qkv(length=16)
    torch.testing.assert_close(module(q, k, v), dense_attention(q, k, v))


def test_shorter_inputs_use_the_first_columns():
    module = build(k=10, max_seq_len=32)
    set_identity_columns(module, 10)  # columns 10.. stay random and must not be read
    q, k, v = qkv(length=10)
    torch.testing.assert_close(module(q, k, v), dense_attention(q, k, v))


@pytest.mark.parametrize("share", ["none", "headwise", "kv", "layerwise"])
def test_identity_init_with_k_equal_to_length_starts_as_full_attention(share):
    q, k, v = qkv(length=16)
    torch.testing.assert_close(
        build(share=share, init="identity")(q, k, v), dense_attention(q, k, v)
    )


def test_identity_init_with_k_above_length_adds_null_slots():
    """k = 24 > L = 10 (of N = 32): the L keys and values, plus 14 slots whose key and value are
    0 (each scores 0 and adds nothing but weight to the softmax's denominator)."""
    q, k, v = qkv(length=10)
    null = torch.zeros(*k.shape[:2], 14, k.shape[-1], dtype=k.dtype)
    expected = dense_attention(q, torch.cat([k, null], dim=2), torch.cat([v, null], dim=2))
    torch.testing.assert_close(build(k=24, max_seq_len=32, init="identity")(q, k, v), expected)


def test_learn_projection_false_keeps_e_and_f_out_of_training():
    """The same outputs; E and F take no gradient, so no optimizer moves them."""
    q, k, v = qkv(length=12, requires_grad=True)
    learned, fixed = build(init="identity"), build(init="identity", learn_projection=False)
    out = fixed(q, k, v)
    torch.testing.assert_close(out, learned(q, k, v))
    out.sum().backward()
    assert not any(p.requires_grad for p in fixed.parameters())
    assert all(p.grad is None for p in fixed.parameters())


def test_at_the_papers_start_a_key_match_does_not_select_its_position():
    """Why the control sits at the key-blind floor (docs/quality.md, "Covering patterns"): with
    E and F drawn as the paper's code draws them (k = 256 of N = 1024, L = 64), a query whose
    score is 10 at one position and 0 elsewhere gets an output whose weights over the positions
    (softmax(E s) F) put about 1/L of their mass on that position; from [I; 0], all of it."""

    def share_on_match(init: str) -> float:
        torch.manual_seed(0)
        module = build_attention("linformer", k=256, n_heads=1, max_seq_len=1024, init=init)
        e, f = (p.detach()[0, :, :64] for p in (module.key_proj, module.value_proj))
        shares = []
        for position in range(64):
            scores = torch.zeros(64)
            scores[position] = 10.0
            weights = torch.softmax(e @ scores, 0) @ f  # (L,) each position's weight
            shares.append((weights[position].abs() / weights.abs().sum()).item())
        return sum(shares) / len(shares)

    assert share_on_match("xavier") < 2 / 64
    assert share_on_match("identity") > 0.99


def test_default_init_is_the_papers_xavier_bound():
    """xavier-uniform with gain 1/sqrt(2) over (k, N): U(-b, b), b = sqrt(3 / (k + N))."""
    module = build_attention("linformer", k=64, n_heads=2, max_seq_len=192)
    bound = (3 / (64 + 192)) ** 0.5
    for proj in (module.key_proj, module.value_proj):
        assert proj.abs().max() <= bound
        assert proj.abs().max() > 0.9 * bound


@pytest.mark.parametrize(
    ("share", "n_params"),
    [("none", 2 * 3 * 5 * 16), ("headwise", 2 * 5 * 16), ("kv", 5 * 16), ("layerwise", 5 * 16)],
)
def test_share_modes_have_the_documented_parameter_count(share, n_params):
    module = build(k=5, share=share)
    assert sum(p.numel() for p in module.parameters()) == n_params


def test_layerwise_tie_shares_one_parameter_and_accumulates_both_gradients():
    first, second = build(share="layerwise"), build(share="layerwise")
    second.tie_to(first)
    assert second.key_proj is first.key_proj
    joint = torch.nn.ModuleList([first, second])
    assert sum(p.numel() for p in joint.parameters()) == 16 * 16

    q, k, v = qkv(length=12)
    loss_first = first(q, k, v).square().sum()
    loss_second = second(k, v, q).square().sum()  # other inputs, so the two gradients differ
    (grad_first,) = torch.autograd.grad(loss_first, first.key_proj, retain_graph=True)
    (grad_second,) = torch.autograd.grad(loss_second, first.key_proj, retain_graph=True)
    (loss_first + loss_second).backward()
    torch.testing.assert_close(first.key_proj.grad, grad_first + grad_second)
    assert grad_second.abs().sum() > 0


def test_tie_to_leaves_other_share_modes_separate():
    first, second = build(share="kv"), build(share="kv")
    second.tie_to(first)
    assert second.key_proj is not first.key_proj


def test_layerwise_tie_to_a_different_shape_is_refused():
    with pytest.raises(ValueError, match="linformer: option share='layerwise'"):
        build(share="layerwise").tie_to(build(share="layerwise", k=8))


def test_future_positions_leak_into_earlier_outputs():
    module = build()
    q, k, v = qkv(length=16)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 1.0
    v2[:, :, -1] += 1.0
    assert not torch.allclose(module(q, k, v)[:, :, 0], module(q, k2, v2)[:, :, 0])


def test_causal_is_refused_with_the_reason():
    assert attention_spec("linformer").causal_supported is False
    with pytest.raises(ValueError, match=r"'linformer' does not support option causal=True"):
        build_attention("linformer", causal=True)


def test_longer_than_max_seq_len_is_refused():
    q, k, v = qkv(length=17)
    with pytest.raises(ValueError, match="linformer: seq_len 17 exceeds option 'max_seq_len'=16"):
        build()(q, k, v)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"share": "heads"}, "linformer: option 'share' must be one of none, headwise, kv"),
        ({"k": 0}, "linformer: option 'k' must be a positive integer"),
        ({"init": "eye"}, "linformer: option 'init' must be one of xavier, identity"),
        ({"learn_projection": "no"}, "linformer: option 'learn_projection' must be"),
        ({"max_seq_len": 0}, "linformer: option 'max_seq_len' must be a positive integer"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("linformer", **options)


def test_flops():
    assert build(k=5).flops(2, 3, 12, 8) == 4 * 2 * 3 * 12 * 5 * 8 + 2 * 2 * 2 * 3 * 5 * 12 * 8


# kv_heads of 4 query heads and the masks: groups of 2 and 4, padding, documents
GROUPED = [(2, "none"), (1, "none"), (2, "padding"), (1, "segments")]


@pytest.mark.parametrize("kv_heads, masks", GROUPED)
@pytest.mark.parametrize("share", ["none", "headwise", "kv"])
def test_grouped_heads_equal_the_kernel_on_repeated_keys(share, kv_heads, masks):
    module = build(share=share, n_heads=4, k=8, max_seq_len=24)
    keep, segments = padding_and_documents(batch=2, length=24, seed=2)
    given = mask_kwargs(
        keep if masks == "padding" else None, segments if masks == "segments" else None
    )
    q, _, _ = qkv(2, 4, 24, 8, seed=3)
    _, k, v = qkv(2, kv_heads, 24, 8, seed=4)
    assert_grouped_equals_repeated(module, q, k, v, given, params=list(module.parameters()))
