"""The block types that recompute their forward in backward do it inside `replaying()` only."""

import pytest
import torch

from variants.attention.common.base import is_replaying
from variants.blocks import build_block, build_stack


@pytest.mark.parametrize("block", ["checkpoint", "reversible"])
def test_only_the_recompute_runs_inside_replaying(block):
    blocks = [build_block(block, 16, 2).double() for _ in range(2)]
    stack = build_stack(block, blocks)
    x = torch.randn(1, 6, 16, dtype=torch.float64, requires_grad=True)
    calls = []
    for kernel in (b.attn.fn.kernel for b in blocks):
        kernel.register_forward_pre_hook(lambda module, args: calls.append(is_replaying()))
    out = stack(x)
    assert calls == [False, False]
    out.sum().backward()
    assert calls == [False, False, True, True]
