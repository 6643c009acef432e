"""Prefill of a left-padded prompt (variants/attention/common/left_padding.py): a state cache
holds each row's state alone, a cache of positions keeps the pads' slots and leaves them out,
and a kernel or cache that cannot take the padding refuses it, the cache left as it was.
The outputs against each row alone: the conformance kit's `padded_decode`, and the models'
generation (tests/variants/test_generation.py, test_hf.py)."""

from __future__ import annotations

import pytest
import torch

from variants import build_attention
from variants.attention.full.layer import FullAttention
from variants.checks import UnsupportedCombination

H, D, PAD, LENGTH = 2, 8, 3, 7


def _inputs(kernel, batch=2, length=LENGTH):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, H, length, D, generator=g, dtype=torch.float64) for _ in "qkv")
    gates = None
    if kernel.n_gates:
        noise = torch.randn(batch, H, length, kernel.n_gates, generator=g, dtype=torch.float64)
        gates = torch.sigmoid(noise)
    return q, k, v, gates


def _kernel(name, **options):
    torch.manual_seed(0)
    return build_attention(name, causal=True, **options).double().eval()


def _prefill(kernel, inputs, mask=None):
    q, k, v, gates = inputs
    cache = kernel.init_cache(q.shape[0], H, D, max_len=16, dtype=torch.float64)
    out = kernel.prefill(q, k, v, cache, gates, attention_mask=mask)
    return out, cache


def _row_padded():
    mask = torch.ones(2, LENGTH, dtype=torch.bool)
    mask[0, :PAD] = False  # row 0: LENGTH - PAD real tokens behind PAD pads
    return mask


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("linear", {}),
        ("performer", {"head_dim": D}),
        ("deltanet", {"chunk_size": 2, "short_conv": 3, "n_heads": H, "head_dim": D}),
        ("mamba2", {"chunk_size": 2, "n_heads": H, "head_dim": D}),
    ],
)
def test_a_state_cache_holds_each_rows_state_alone(name, options):
    kernel = _kernel(name, **options)
    inputs = _inputs(kernel)
    out, cache = _prefill(kernel, inputs, _row_padded())
    assert cache.length == LENGTH and cache.pads.tolist() == [PAD, 0]
    alone_out, alone = _prefill(kernel, [None if x is None else x[:1, :, PAD:] for x in inputs])
    assert torch.equal(cache.state[0], alone.state[0])  # bit for bit: the row's own run
    for held in ("shift", "conv_tail"):
        if getattr(alone, held, None) is not None:
            assert torch.equal(getattr(cache, held)[0], getattr(alone, held)[0]), held
    assert torch.equal(out[:1, :, PAD:], alone_out) and not out[0, :, :PAD].any()
    full_out, full = _prefill(kernel, [None if x is None else x[1:] for x in inputs])
    assert torch.equal(cache.state[1], full.state[0]) and torch.equal(out[1:], full_out)


def test_a_cache_of_positions_keeps_the_pads_slots_and_masks_them():
    kernel = _kernel("full")
    out, cache = _prefill(kernel, _inputs(kernel), _row_padded())
    assert cache.length == LENGTH and cache.pads.tolist() == [PAD, 0]
    assert not cache.keys()[0, :, :PAD].any()  # pads read as zeros, as the forward's
    real = cache.real_keys(torch.arange(LENGTH))  # (B, 1, 1, n)
    assert real.shape == (2, 1, 1, LENGTH)
    assert real[0, 0, 0].tolist() == [False] * PAD + [True] * (LENGTH - PAD) and real[1].all()


class Unmasked(FullAttention):
    """Full attention that says its decode step ignores a padded prompt's slots."""

    decode_masks_padding = False


@pytest.mark.parametrize(
    ("kernel", "why"),
    [
        (_kernel("blockwise", block_size=4), "its pattern is absolute in position"),
        (_kernel("sliding_window", window=4, sink_tokens=1), "its pattern is absolute"),
        (Unmasked(causal=True).double(), "its decode step does not leave out"),
    ],
)
def test_what_cannot_take_left_padding_refuses_it_and_leaves_the_cache_empty(kernel, why):
    q, k, v, gates = _inputs(kernel)
    cache = kernel.init_cache(2, H, D, max_len=16, dtype=torch.float64)
    assert why in kernel.padded_prefill_reason(cache)
    with pytest.raises(UnsupportedCombination, match=f"left-padded option 'attention_mask': {why}"):
        kernel.prefill(q, k, v, cache, gates, attention_mask=_row_padded())
    assert cache.length == 0 and cache.pads is None
    kernel.prefill(q, k, v, cache, gates, attention_mask=torch.ones(2, LENGTH, dtype=torch.long))
    assert cache.length == LENGTH and cache.pads is None  # a mask without pads: no mask


def test_a_mask_that_is_not_a_left_padded_prompt_is_refused_in_one_line():
    kernel = _kernel("linear")
    inputs = _inputs(kernel)
    right = _row_padded().flip(1)
    with pytest.raises(ValueError, match="linear: option 'attention_mask' must be left padding"):
        _prefill(kernel, inputs, right)
    with pytest.raises(ValueError, match=r"linear: option 'attention_mask' must be .* \(2, 7\)"):
        _prefill(kernel, inputs, _row_padded()[:, 1:])
