"""The CUDA paths (`make test-gpu`): every variant, the reversible block and a sweep on a GPU.

Each result on CUDA is compared with the same kernel's on the CPU, whose correctness the rest of
the suite checks against independent references. Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import variants
from tests.experiments.conftest import Cli
from tests.reference import Gated

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SHAPE = (2, 2, 200, 32)  # (B, H, L, D); L not a multiple of any block or bucket size
# Kernels that hash or route by content: a bfloat16 rounding moves a few tokens to another
# bucket or cluster, which changes those tokens' keys, so their outputs agree less closely.
BY_CONTENT = ("lsh", "routing")


def _kernel(name: str) -> torch.nn.Module:
    """`name` as a model would build it, seeded where it draws at random, in eval mode (no
    centroid updates or feature redraws between the two devices' calls)."""
    spec = variants.attention_spec(name)
    options = {"causal": spec.causal_supported}
    model_options = {
        "n_heads": SHAPE[1],
        "head_dim": SHAPE[3],
        "max_seq_len": SHAPE[2],
        "shared_qk": spec.shared_qk_required,
    }
    options |= {k: v for k, v in model_options.items() if k in spec.model_options}
    if "seed" in spec.options:
        options["seed"] = 0
    torch.manual_seed(0)
    return Gated(variants.build_attention(name, **options)).eval()  # fixed gates if gated


def _forward_backward(kernel, q, k, v, grad_out):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if kernel.applies_shared_qk:
        k = q
    out = kernel(q, k, v)
    out.backward(grad_out)
    grads = [q.grad] if kernel.applies_shared_qk else [q.grad, k.grad, v.grad]
    return [out.float(), *(g.float() for g in grads), v.grad.float()]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu(), b.detach().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("name", variants.attention_names())
def test_every_variant_on_cuda_matches_the_cpu_in_float32(name):
    generator = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    on_cpu = _kernel(name)
    on_gpu = copy.deepcopy(on_cpu).to(CUDA)
    expected = _forward_backward(on_cpu, q, k, v, grad_out)
    got = _forward_backward(on_gpu, *(t.to(CUDA) for t in (q, k, v, grad_out)))
    for a, b in zip(got, expected, strict=True):
        assert _relative(a, b) < 1e-4, name


@pytest.mark.parametrize("name", variants.attention_names())
def test_every_variant_on_cuda_trains_under_bfloat16_autocast(name):
    generator = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    on_cpu = _kernel(name)
    on_gpu = copy.deepcopy(on_cpu).to(CUDA)
    expected = _forward_backward(on_cpu, q, k, v, grad_out)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        inputs = (t.to(CUDA, torch.bfloat16) for t in (q, k, v, grad_out))
        got = _forward_backward(on_gpu, *inputs)
    bound = 0.25 if name in BY_CONTENT else 0.05
    for a, b in zip(got, expected, strict=True):
        assert torch.isfinite(a).all() and _relative(a, b) < bound, name


@pytest.mark.parametrize("attention", ["full", "lsh", "routing"])
def test_reversible_gradients_on_cuda_equal_the_cpu_ones(attention):
    torch.manual_seed(0)
    options = {"n_hashes": 2, "bucket_size": 16, "seed": 0} if attention == "lsh" else {}
    model = variants.TransformerLM(
        vocab_size=32,
        d_model=32,
        n_heads=2,
        depth=3,
        attention=attention,
        attention_options=options,
        block="reversible",
    ).double()
    tokens = torch.randint(32, (2, 96))
    grads = {}
    for device in (CPU, CUDA):
        net = copy.deepcopy(model).to(device)
        net.eval()  # routing's centroids do not move between the two devices' passes
        loss = net(tokens.to(device)).square().mean()
        grads[device] = torch.autograd.grad(loss, list(net.parameters()))
    for a, b in zip(grads[CUDA], grads[CPU], strict=True):
        assert _relative(a, b) < 1e-8


def test_a_two_job_sweep_runs_on_cuda(tmp_path):
    cli = Cli(tmp_path / "home")
    cli.sweep(tmp_path / "sweep", "device=cuda", "attention=full,lsh", "logger=none")
    records = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/result.json"))
    ]
    assert len(records) == 2
    for rec in records:
        assert rec["status"] == "ok" and rec["device"] == "cuda", rec.get("error")
        assert rec["device_name"] == torch.cuda.get_device_name(0)
        assert rec["peak_memory_bytes"] > 0 and rec["attn_fwd_bwd_ms"] > 0


# --- the fused path of flash.attend on CUDA: merged parts run fused where exact attention does -

FLASH_KERNELS = ("lsh", "strided", "compressed", "longformer", "bigbird", "sparse_fixed", "routing")


@pytest.mark.parametrize("name", FLASH_KERNELS)
def test_flash_kernels_run_fused_on_cuda_and_match_the_cpu(name, monkeypatch):
    """The kernels that merge parts by logsumexp run CUDA's memory-efficient kernels (forward
    and backward, returning and taking the logsumexp) and agree with the CPU."""
    from variants.attention.common import flash

    on_cpu = _kernel(name)
    assert on_cpu.kernel_path(CUDA, torch.float32) == "fused"
    calls = []
    forward, backward = flash.efficient_ops()
    monkeypatch.setattr(
        flash,
        "efficient_ops",
        lambda: (
            lambda *a, **o: calls.append("forward") or forward(*a, **o),
            lambda *a, **o: calls.append("backward") or backward(*a, **o),
        ),
    )
    generator = torch.Generator().manual_seed(2)
    q, k, v, grad_out = (torch.randn(SHAPE, generator=generator) for _ in range(4))
    on_gpu = copy.deepcopy(on_cpu).to(CUDA)
    expected = _forward_backward(on_cpu, q, k, v, grad_out)
    got = _forward_backward(on_gpu, *(t.to(CUDA) for t in (q, k, v, grad_out)))
    assert "forward" in calls and "backward" in calls
    for a, b in zip(got, expected, strict=True):
        assert _relative(a, b) < 1e-4, name
