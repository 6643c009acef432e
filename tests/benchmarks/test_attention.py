"""Micro-benchmarks of every attention variant, forward and forward+backward, 1K to 32K tokens.

Skipped by the default test run (`--benchmark-skip`); `make bench-micro` runs them, saves the
JSON under .benchmarks/ and compares with the previous saved run. Shapes follow the performance
targets: batch 1, 4 heads, head_dim 64, fp32, causal (Linformer cannot be causal and runs
unmasked); `sdpa` is the bare fused call every variant is compared with. Select lengths with
-k, e.g. `-k "not L16384 and not L32768"` for a quick run; at 32K one call of full attention
takes ~13 s, so the long lengths run few rounds.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

# The same shapes and kernels as the target table, over a wider range of lengths.
from benchmarks.targets.kernels import BATCH, HEAD_DIM, HEADS, kernel, kernel_settings

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]

pytestmark = pytest.mark.bench


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention(name: str, length: int):
    return sdpa if name == "sdpa" else kernel(name, length)


def run(benchmark, fn, length: int) -> None:
    # pytest-benchmark's default calibration would repeat a 13 s call for a minute; a few
    # rounds after one warm-up give a usable median at the long lengths.
    rounds = 10 if length <= 4096 else 3
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=1)


lengths = pytest.mark.parametrize("length", LENGTHS, ids=[f"L{n}" for n in LENGTHS])
names = pytest.mark.parametrize("name", ["sdpa", *kernel_settings()])


@lengths
@names
def test_forward(benchmark, name, length):
    kernel = attention(name, length)
    q, k, v = (torch.randn(BATCH, HEADS, length, HEAD_DIM) for _ in range(3))
    benchmark.group = f"forward L{length}"

    def forward():
        with torch.no_grad():
            return kernel(q, k, v)  # (B, H, L, D)

    run(benchmark, forward, length)


@lengths
@names
def test_forward_backward(benchmark, name, length):
    kernel = attention(name, length)
    q, k, v = (torch.randn(BATCH, HEADS, length, HEAD_DIM, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(BATCH, HEADS, length, HEAD_DIM)
    benchmark.group = f"forward+backward L{length}"

    def forward_backward():
        out = kernel(q, k, v)  # (B, H, L, D)
        return torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)

    run(benchmark, forward_backward, length)
