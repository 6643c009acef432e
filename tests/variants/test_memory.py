"""Memory grows as each variant promises, measured device-independently.

The figure is the peak of live tensor bytes during forward+backward of the kernel alone (the
profiler's allocation events replayed in time order), so it means the same on CPU and CUDA.
"""

import pytest
import torch

import variants
from experiments.measurement.memory import peak_memory_bytes
from tests.reference import qkv

LINEAR = {
    "blockwise": {"block_size": 128},
    "lsh": {"seed": 0},
    "linformer": {"k": 64, "n_heads": 2, "max_seq_len": 4096},
    "full": {"impl": "sdpa"},  # fused: never holds the (L, L) scores
}


def fwd_bwd_peak_bytes(module, length):
    q, k, v = qkv(1, 2, length, 32, dtype=torch.float32, requires_grad=True)
    return peak_memory_bytes(lambda: module(q, k, v).sum().backward())


@pytest.mark.parametrize("name", LINEAR)
def test_linear_memory_variants_at_most_2_3x_when_length_doubles(name):
    causal = variants.attention_spec(name).causal_supported
    module = variants.build_attention(name, causal=causal, **LINEAR[name])
    ratio = fwd_bwd_peak_bytes(module, 4096) / fwd_bwd_peak_bytes(module, 2048)
    assert ratio <= 2.3


def test_explicit_scores_grow_about_4x_when_length_doubles():
    module = variants.build_attention("full", causal=True, impl="math")
    ratio = fwd_bwd_peak_bytes(module, 2048) / fwd_bwd_peak_bytes(module, 1024)
    assert 3.5 <= ratio <= 4.5
