"""Every variant runs forward and backward under bfloat16 autocast, close to float32.

Mixed-precision jobs (dtype=bfloat16) run the kernels under autocast over float32 parameters;
tests/gpu checks the same on CUDA.
"""

from __future__ import annotations

import pytest
import torch

import variants
from tests.gpu.test_cuda import BY_CONTENT, SHAPE, _forward_backward, _kernel, _relative


@pytest.mark.parametrize("name", variants.attention_names())
def test_every_variant_under_bfloat16_autocast_is_close_to_float32(name):
    generator = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    kernel = _kernel(name)
    expected = _forward_backward(kernel, q, k, v, grad_out)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _forward_backward(kernel, *(t.bfloat16() for t in (q, k, v, grad_out)))
    bound = 0.25 if name in BY_CONTENT else 0.05
    for a, b in zip(got, expected, strict=True):
        assert torch.isfinite(a).all() and _relative(a, b) < bound, name
