"""The pre-norm residual block against its definition written out here."""

import torch
import torch.nn.functional as F

from variants import build_block


def _layer_norm(norm, x):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def test_residual_block_is_pre_norm_attention_then_feed_forward():
    torch.manual_seed(0)
    block = build_block("residual", 16, 2).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    h = x + block.attn.fn(_layer_norm(block.attn.norm, x))
    expected = h + block.ff.fn(_layer_norm(block.ff.norm, h))
    torch.testing.assert_close(block(x), expected, rtol=0, atol=0)


def test_residual_block_is_causal():
    torch.manual_seed(0)
    block = build_block("residual", 16, 2).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] = torch.randn(1, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(block(x)[:, :6], block(changed)[:, :6])
