"""Which path `flash.attend` takes (fused | explicit) on each device, the CUDA dispatch checked
on the CPU with stand-ins for the memory-efficient ops, and every kernel's `kernel_path`."""

from __future__ import annotations

import pytest
import torch

from tests.reference import qkv
from variants import attention_names, build_attention
from variants.attention.common import flash


def test_paths_by_device_and_dtype(monkeypatch):
    assert flash.path("cpu", torch.float32) == flash.path("cpu", torch.float64) == "fused"
    assert flash.path("cuda", torch.float64) == "explicit"  # no float64 efficient kernel
    assert flash.path("mps", torch.float32) == "explicit"
    assert flash.path("cuda", torch.bfloat16) == (
        "fused" if flash.FUSED_CUDA_KERNELS else "explicit"
    )
    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", False)
    assert flash.path("cpu", torch.float32) == "explicit"


def _stand_ins(calls):
    """CPU stand-ins for the CUDA memory-efficient ops with their contract: the bias comes as
    (B, N, Lq, Lk) with aligned rows, the logsumexp is padded to a multiple of 32 queries (the
    padding garbage), and the backward reads it back padded."""

    def forward(q, k, v, bias, compute_lse, dropout_p, causal, *, scale):
        assert compute_lse and dropout_p == 0.0
        if bias is not None:
            assert bias.shape == (*q.shape[:-1], k.shape[-2]) and bias.stride(-1) == 1
            assert bias.stride(-2) % flash.CUDA_BIAS_ALIGN == 0
        calls.append("forward")
        out, lse = flash._explicit_attend(q, k, v, scale=scale, bias=bias, causal=causal)
        padded = torch.full((*lse.shape[:-1], -(-lse.shape[-1] // 32) * 32), 7.0)
        padded[..., : lse.shape[-1]] = lse
        return out, padded, torch.empty(()), torch.empty(())

    def backward(
        grad_out, q, k, v, bias, out, lse, seed, offset, dropout_p, mask, causal, *, scale
    ):
        assert lse.shape[-1] % 32 == 0 and list(mask) == [True, True, True, False]
        calls.append("backward")
        lse = lse[..., : q.shape[-2]]
        grads = flash._explicit_backward(
            grad_out, q, k, v, out, lse, scale=scale, bias=bias, causal=causal
        )
        return (*grads, None)

    return forward, backward


@pytest.fixture
def as_if_cuda(monkeypatch):
    """flash's fused path as on CUDA, through the stand-ins; returns the calls made."""
    calls = []
    monkeypatch.setattr(flash, "fused_kind", lambda x: "cuda")
    monkeypatch.setattr(flash, "efficient_ops", lambda: _stand_ins(calls))
    return calls


@pytest.mark.parametrize(
    "name, options",
    [
        ("lsh", {"n_hashes": 2, "bucket_size": 4, "seed": 0}),
        ("strided", {"stride": 5}),
        ("compressed", {"head_dim": 8}),
        ("bigbird", {"block_size": 4, "seed": 0}),
    ],
)
def test_the_cuda_dispatch_gives_the_cpu_results(name, options, request):
    q, k, v = qkv(1, 2, 37, 8, seed=4, dtype=torch.float32, requires_grad=True)
    module = build_attention(name, causal=True, **options)
    if name == "lsh":
        k = q
    out = module(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    calls = request.getfixturevalue("as_if_cuda")
    cuda_out = module(q, k, v)
    cuda_grads = torch.autograd.grad(cuda_out.square().sum(), (q, v))
    assert "forward" in calls and "backward" in calls
    torch.testing.assert_close(cuda_out, out, rtol=1e-4, atol=1e-5)
    for got, want in zip(cuda_grads, grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_every_kernel_says_its_path():
    # No softmax attention: a feature map or a recurrence in explicit matmuls.
    expected_cpu = {
        name: "explicit" for name in ("performer", "linear", "deltanet", "gated_deltanet", "mamba2")
    }
    for name in attention_names():
        kernel = build_attention(name)
        assert kernel.kernel_path("cpu", torch.float32) == expected_cpu.get(name, "fused"), name
        on_cuda64 = kernel.kernel_path("cuda", torch.float64)
        assert on_cuda64 == "explicit", name  # SDPA's and flash's float64 CUDA paths are explicit
    assert build_attention("full", impl="math").kernel_path("cpu", torch.float32) == "explicit"
    flash_user = build_attention("strided")
    assert flash_user.kernel_path("cuda", torch.float32) == flash.path("cuda", torch.float32)


# --- grouped key sets: query set n reads key set n // (N / N_kv) -------------------------------
def _grouped_against_repeated(causal):
    """flash.attend and attend_backward on 2 key sets for 6 query sets, and on the keys
    repeated to 6 sets (each repeated key's gradient summed over its group)."""
    q, _, _ = qkv(2, 6, 13, 8, seed=5)
    _, k, v = qkv(2, 2, 13 if causal else 9, 8, seed=6)
    bias = None if causal else torch.randn(1, 1, 13, 9, dtype=q.dtype)
    options = {"scale": 0.3, "bias": bias, "causal": causal}
    k_rep, v_rep = (x.repeat_interleave(3, dim=1) for x in (k, v))
    out, lse = flash.attend(q, k, v, **options)
    want_out, want_lse = flash.attend(q, k_rep, v_rep, **options)
    grad_out = torch.randn_like(out)
    grads = flash.attend_backward(grad_out, q, k, v, out, lse, **options)
    want_q, want_k, want_v = flash.attend_backward(
        grad_out, q, k_rep, v_rep, want_out, want_lse, **options
    )
    want = (want_q, *(g.unflatten(1, (2, 3)).sum(dim=2) for g in (want_k, want_v)))
    return (out, lse, *grads), (want_out, want_lse, *want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["fused", "explicit", "cuda"])
def test_grouped_key_sets_equal_repeated_ones_on_every_path(causal, path, monkeypatch, request):
    if path == "explicit":
        monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", False)
    if path == "cuda":
        request.getfixturevalue("as_if_cuda")
    got, want = _grouped_against_repeated(causal)
    assert got[3].shape == want[3].shape == (2, 2, *got[3].shape[2:])  # the key sets' gradient
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
