"""A kernel's approximation error against exact attention, and what swapping it into a trained
model costs: `approx_columns` gives a job's approximation-error columns. Exact attention over
q, k, v drawn from N(0, 1) is nearly uniform at realistic head sizes, so every approximation
looks broken on such inputs (`gaussian_inputs`, kept for comparison only); `approx_rel_error` is
measured on the q, k, v of the reference model (experiments/measurement/reference_model.py) on
held-out text at the job's length (`trained_inputs`), with a kernel that has learned state
fitted to it first (experiments/measurement/kernel_fit.py), and `swap_bits_per_byte` is the
reference's held-out bits/byte with the kernel in every layer instead of exact attention.

Grouped KV heads (`model.n_kv_heads` = H_kv < H): the reference model has the job's H_kv key
heads, the Gaussian k, v are drawn with H_kv heads, and the kernel and exact attention
(`exact_attention`: query head h reads key head h // (H / H_kv)) run on those grouped k, v.
`approx_reference_n_kv_heads` records H_kv.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

import variants
from experiments.job_config import JobConfig
from experiments.measurement import kernel_fit, reference_model
from experiments.training.precision import Precision
from experiments.training.train import evaluate
from variants.attention.common.base import Attention, sample_gates
from variants.layers import SelfAttention, kernels_swapped


class Built(Protocol):
    """What `approx_columns` reads of a job's `measure.Setup`: typed by what it reads, as
    measure.py imports this module and this module does not import measure.py."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def precision(self) -> Precision: ...

    @property
    def kernel(self) -> Attention: ...

    @property
    def model(self) -> nn.Module: ...


def approx_columns(job: JobConfig, built: Built, shape) -> dict[str, Any]:
    """The approximation-error columns: the kernel's error against exact attention on the
    trained reference's q, k, v, and the kernel swap's bits/byte change, both within the
    reference's trained length only (NaN beyond, `approx_error_note` says why); the Gaussian
    figure at any length.

    The kernel measured is a fresh one of the job's config, fitted to the frozen reference first
    if it has learned state (`kernel_fit.fitted_kernel`); the reference is trained with
    the job's shared QK and KV heads. shape: the kernel's q's (batch, heads, seq_len,
    head_dim); its k, v have the job's `n_kv_heads` heads (`ReferenceConfig.kv_heads`).
    """
    device, dtype, precision, m_cfg = built.device, built.dtype, built.precision, job.measure
    seeds = m_cfg.approx_seeds
    config = reference_model.ReferenceConfig.of_job(job)
    directory = reference_model.cache_dir(m_cfg.reference.get("cache_dir"))
    reference = reference_model.load_or_train(config, device, directory)
    columns: dict[str, Any] = {
        "approx_reference_digest": reference.digest,
        "approx_reference_bits_per_byte": reference.eval_bits_per_byte,
        "approx_reference_seq_len": config.trained_length,
        "approx_reference_n_kv_heads": config.kv_heads,
    }
    with precision.autocast():
        columns["approx_rel_error_gaussian"] = approx_rel_error(
            built.kernel, gaussian_inputs(shape, seeds, kv_heads=config.kv_heads), device, dtype
        )
    if job.seq_len > config.trained_length:
        columns.update(
            approx_rel_error=None,
            swap_delta_bits_per_byte=None,
            approx_error_note=f"seq_len {job.seq_len} is past the reference's trained length "
            f"{config.trained_length} (measure.reference.long_seq_len): not measured out of "
            "distribution",
        )
        return columns
    exact = exact_attention(causal=built.kernel.causal, shared_qk=built.kernel.applies_shared_qk)
    kernel, fit_steps, fit_length = kernel_fit.fitted_kernel(
        reference,
        built.model.config,
        seq_len=job.seq_len,
        device=device,
        directory=directory,
        exact=exact,
    )
    columns["approx_kernel_fit_steps"] = fit_steps
    columns["approx_kernel_fit_seq_len"] = fit_length
    inputs = (
        reference_model.for_kernel(triple, kernel, shared_qk=config.shared_qk)
        for triple in trained_inputs(reference, shape, device, seeds)
    )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(job.seed)
        with precision.autocast():
            columns["approx_rel_error"] = approx_rel_error(kernel, inputs, device, dtype)
        if kernel.causal and not kernel.n_gates:
            exact_bpb, swapped_bpb = swap_bits_per_byte(
                reference,
                kernel,
                seq_len=job.seq_len,
                batch_size=job.batch_size,
                n_batches=seeds,
                device=device,
            )
            columns["swap_delta_bits_per_byte"] = swapped_bpb - exact_bpb
        else:
            columns["swap_delta_bits_per_byte"] = None
            columns["approx_error_note"] = (
                "no kernel swap: the reference's layers have no gate projection for a gated kernel"
                if kernel.n_gates
                else "no kernel swap: a bidirectional kernel in the causal reference would see "
                "the bytes it predicts"
            )
    return columns


@torch.no_grad()
def swap_bits_per_byte(
    reference: reference_model.ReferenceModel,
    kernel: Attention,
    *,
    seq_len: int,
    batch_size: int,
    n_batches: int,
    device: torch.device,
) -> tuple[float, float]:
    """Held-out bits/byte of the reference at `seq_len` with exact attention and with `kernel`
    in every layer instead (the Reformer's Table 2 protocol: projections as trained), over the
    first `n_batches` eval batches of `batch_size` sequences. Returns (exact, swapped)."""
    task = reference_model._text_task(reference.config, seq_len=seq_len, batch_size=batch_size)
    layers = [m for m in reference.model.modules() if isinstance(m, SelfAttention)]
    exact_loss = evaluate(reference.model, task, device, n_batches).loss
    with kernels_swapped(layers, [kernel] * len(layers)):
        swapped_loss = evaluate(reference.model, task, device, n_batches).loss
    return exact_loss / math.log(2), swapped_loss / math.log(2)


def exact_attention(*, causal: bool, shared_qk: bool) -> Attention:
    """What a kernel's error is measured against: the `full` kernel, causal iff the kernel is,
    under shared QK iff the kernel applies it. On k, v of H_kv heads dividing q's H it is
    grouped-head exact attention (query head h reads key head h // (H / H_kv)) without repeating
    them (SDPA's `enable_gqa`, variants/attention/full/layer.py)."""
    return variants.build_attention("full", causal=causal, shared_qk=shared_qk)


@torch.no_grad()
def approx_rel_error(
    kernel: Attention,
    inputs: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """Mean over `inputs` of ||kernel(q,k,v) - exact|| / ||exact|| (Frobenius).

    inputs: (q, k, v) triples, q of the kernel's shape (batch, heads, seq_len, head_dim), k, v
    of (batch, kv_heads, seq_len, head_dim) with kv_heads dividing heads (grouped KV heads).
    Exact attention is `exact_attention` on the same inputs, causal iff the kernel is (grouped-head
    exact attention when kv_heads < heads, on the grouped k, v the kernel gets too). A kernel
    under the Reformer's shared-QK rule (LSH, or one built with `shared_qk=True`) gets k = q and
    is compared with exact shared-QK attention (unit keys, self masked unless alone), so the
    error is what hashing, chunking or the pattern cost, not the convention. Measured in eval
    mode (no centroid or feature updates), in float32 or wider. A gated kernel (NSA, DeltaNet)
    gets sigmoid(N(0, 1)) gates, seeded per input.
    """
    shared_qk = kernel.applies_shared_qk
    exact_kernel = exact_attention(causal=kernel.causal, shared_qk=shared_qk)
    was_training = kernel.training
    kernel.eval()
    errors = []
    try:
        for index, (q, k, v) in enumerate(inputs):
            q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
            if shared_qk:
                k = q
            generator = torch.Generator().manual_seed(20_000 + index)
            out = kernel(q, k, v, gates=sample_gates(kernel, q, generator)).float()
            exact = exact_kernel(q, k, v).float()
            errors.append(
                float(torch.linalg.vector_norm(out - exact) / torch.linalg.vector_norm(exact))
            )
    finally:
        kernel.train(was_training)
    return sum(errors) / len(errors)


def gaussian_inputs(
    shape, seeds: int, kv_heads: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`seeds` draws of q, k, v from N(0, 1) (CPU, float32): q of `shape` (batch, heads,
    seq_len, head_dim), k and v of `kv_heads` heads (grouped KV heads; default heads).

    Only for `approx_rel_error_gaussian`: at realistic head sizes exact attention over such
    inputs is nearly uniform, so this error says little about trained models.
    """
    kv_shape = (shape[0], shape[1] if kv_heads is None else kv_heads, *shape[2:])
    for seed in range(seeds):
        g = torch.Generator(device="cpu").manual_seed(10_000 + seed)
        q = torch.randn(shape, generator=g)  # (B, H, L, D)
        # (B, H_kv, L, D) each; drawn after q as before, so without grouped heads the same.
        k, v = (torch.randn(kv_shape, generator=g) for _ in range(2))
        yield q, k, v


def trained_inputs(
    reference: reference_model.ReferenceModel, shape, device: torch.device, seeds: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q, k, v of every layer of the trained reference model on `seeds` held-out text batches.

    shape: the kernel's (batch, heads, seq_len, head_dim); the reference has the same heads
    and head_dim, and the job's KV heads (`ReferenceConfig.of_job`): k, v are (batch,
    kv_heads, seq_len, head_dim).
    """
    batch, _, seq_len, _ = shape
    for index in range(seeds):
        yield from reference_model.attention_inputs(
            reference, seq_len=seq_len, batch_size=batch, index=index, device=device
        )
