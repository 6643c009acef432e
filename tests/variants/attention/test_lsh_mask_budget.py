"""LSH's window masks: whole when they fit `masks.MASK_BYTES`, else rebuilt per slice and round;
the two paths give the same outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from tests.reference import qkv
from variants import build_attention
from variants.attention.common import buffers
from variants.attention.common.base import replaying
from variants.attention.lsh import masks


def test_the_budget_chooses_the_path(monkeypatch):
    # The benchmark's shape (B 1, 4 heads, 4 rounds, m 64): 64 MiB of mask at 32K, built whole
    # as before; 2 GiB at 2^20 tokens, rebuilt per slice and round.
    whole_32k = 1 * 4 * 4 * 32768 * 2 * 64
    assert whole_32k <= masks.MASK_BYTES < 32 * whole_32k
    order = torch.arange(256).expand(4, 4, 256)  # (S, R, Lp): 4 chunks, every round unsorted
    hidden = masks.hidden_keys(order, order, 256, 64, causal=True, dedup=True)
    assert isinstance(hidden, torch.Tensor) and hidden.shape == (4, 4, 4, 64, 128)
    assert hidden.numel() == 4 * 4 * 256 * 128  # the size the budget is compared with
    monkeypatch.setattr(masks, "MASK_BYTES", hidden.numel() - 1)
    per_round = masks.hidden_keys(order, order, 256, 64, causal=True, dedup=True)
    assert isinstance(per_round, masks.RoundMasks)
    for r in range(4):
        torch.testing.assert_close(per_round.round(slice(1, 3), r), hidden[1:3, r], rtol=0, atol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("length", "dedup"), [(40, True), (38, False)])
def test_masks_per_slice_and_round_give_the_same_outputs_and_gradients(
    causal, length, dedup, monkeypatch, flash_kernels
):
    q, _, v = qkv(2, 2, length, 8, seed=3, requires_grad=True)
    module = build_attention("lsh", causal=causal, n_hashes=3, bucket_size=4, seed=1, dedup=dedup)
    built = []
    real_round = masks.RoundMasks.round
    monkeypatch.setattr(
        masks.RoundMasks, "round", lambda self, *a: built.append(a) or real_round(self, *a)
    )
    out = module(q, q, v)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    assert not built  # a few KiB of mask: the whole-mask path
    monkeypatch.setattr(masks, "MASK_BYTES", 0)
    monkeypatch.setattr(buffers, "SLICE_BYTES", 1)  # one sequence per slice
    with replaying():
        rebuilt = module(q, q, v)
        rebuilt_grads = torch.autograd.grad(rebuilt.square().sum(), (q, v))
    if causal or (dedup and length == 40):
        assert len(built) == 2 * 4 * 3  # forward and backward, per sequence and round
    torch.testing.assert_close(rebuilt, out)
    for got, want in zip(rebuilt_grads, grads, strict=True):
        torch.testing.assert_close(got, want)
