"""What one job measures, the same way for every variant.

`setup(job)` builds the task and the model a job's `experiments.job_config.JobConfig` describes;
`measure(job, built)` runs `MEASUREMENTS` in order, each a small function of the job in
progress (`Measuring`) returning its columns: training, the key-blind diagnostic, the decode
state alone, a mixture's points, other kernels' evaluation, the kernel's time and FLOPs, the
step's time, the timing warning, memory, approximation error, decoding cost, the process's
peak. It returns the measurement columns of the record; the job (experiments/app/job.py
`run_job`) adds identity, status and provenance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn

import variants
from experiments.job_config import JobConfig
from experiments.measurement.approximation import approx_columns
from experiments.measurement.decode_cost import measure_decode, measure_model_decode, state_columns
from experiments.measurement.diagnostics import kernel_input_columns
from experiments.measurement.kernel_rounds import kernel_calls, round_timings, timing_columns
from experiments.measurement.memory import peak_memory_bytes, peak_rss_bytes
from experiments.measurement.timing import Timing, spread_warnings, time_call
from experiments.training.precision import FLOAT32, Precision
from experiments.training.stages import OnStage, OnStep, Trained, mixture_points, train_stages
from experiments.training.tasks import Task, build_task
from experiments.training.train import evaluate, training_loss
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR, Attention


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"option 'device' must be one of auto, cpu, cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("option 'device'=cuda but torch sees no CUDA device")
    return torch.device(name)


@dataclass
class Setup:
    """Everything a configuration builds before anything is measured."""

    device: torch.device
    precision: Precision
    task: Task
    model: nn.Module  # variants.build_lm's: a TransformerLM, or a Llama on the variant

    @property
    def dtype(self) -> torch.dtype:
        """The compute type: what activations and the kernels' inputs are."""
        return self.precision.compute_dtype

    @cached_property
    def kernel(self) -> Attention:
        """The kernel timed alone: the job's attention with its options, the first layer's that
        runs it (every layer's unless `model.layers` mixes variants), or for a hybrid stack
        without such a layer one built for the model, on its device."""
        own = self.model.config.own_layers()
        if own:
            return next(itertools.islice(self.model.kernels(), own[0], None))
        return self.model.config.kernel().to(self.device)


def setup(job: JobConfig) -> Setup:
    """Build a configuration; bad options raise `ValueError` naming the key."""
    device = resolve_device(job.device)
    precision = Precision.of(job.dtype, device)
    if job.threads:
        torch.set_num_threads(int(job.threads))
    torch.manual_seed(job.seed)
    task = build_task(job.task, seq_len=job.seq_len, batch_size=job.batch_size, seed=job.seed)
    # float32 master weights whatever the dtype: half types are autocast (training/precision.py).
    readout = getattr(task, "readout", "tokens")  # MAD's compression: pooled
    model = variants.build_lm(job.model_config(task.vocab_size, readout)).to(device=device)
    built = Setup(device, precision, task, model)
    for kernel in dict.fromkeys([built.kernel, *model.kernels()]):  # a hybrid's every layer's
        check_backward(job, kernel, device)
    # A pinned SDPA backend that cannot run the job's inputs here is refused (skipped) now,
    # not after training.
    built.kernel.sdpa_backend(kernel_shape(job, model), device, built.dtype)
    return built


def kernel_shape(job: JobConfig, model: nn.Module) -> tuple[int, int, int, int]:
    """The (batch, heads, seq_len, head_dim) of the q the kernel is timed on alone; its k and v
    have `model.config.kv_heads` heads (grouped KV heads, `model.n_kv_heads`)."""
    return (job.batch_size, model.config.n_heads, job.seq_len, model.config.head_dim)


def check_backward(job: JobConfig, kernel: Attention, device: torch.device) -> None:
    """A kernel that runs forward only on `device` (`impl=flex` on CPU) can only be timed
    forward: refuse a job that would train it or time or measure a training step."""
    if kernel.supports_backward(device):
        return
    needs = [
        key
        for key, on in (
            ("train.steps", job.train.steps > 0),
            ("measure.step", job.measure.step),
            ("measure.memory", job.measure.memory),
        )
        if on
    ]
    if needs:
        raise ValueError(
            f"attention {kernel.name!r}: option impl='flex' runs forward only on "
            f"{device.type} (PyTorch's FlexAttention has no CPU backward), but "
            f"{', '.join(needs)} need a backward; use attention.impl=native to train, or "
            "train.steps=0 measure.step=false measure.memory=false to time its forward"
        )


@dataclass
class Measuring:
    """One job's measurements in progress: what each reads (the job, what was built, the
    callbacks, the columns so far) and what one leaves for a later one (training's result, the
    kernel's calls, the training step, the timings whose spreads `timing_warning` reads)."""

    job: JobConfig
    built: Setup
    on_step: OnStep | None = None
    on_stage: OnStage | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    trained: Trained | None = None
    kernel_fwd: Callable[[], None] | None = None
    kernel_fwd_bwd: Callable[[], None] | None = None
    step: Callable[[], None] | None = None
    timings: dict[str, Timing] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return kernel_shape(self.job, self.built.model)


def environment(m: Measuring) -> dict[str, Any]:
    """Where and how the job runs: device, precision, threads, parameters, the kernel's path."""
    built, kernel = m.built, m.built.kernel
    return {
        "device": built.device.type,
        "precision": built.precision.label,
        "threads": torch.get_num_threads(),
        "n_parameters": sum(p.numel() for p in built.model.parameters()),
        "kernel_path": kernel.kernel_path(built.device, built.dtype),
        "sdpa_backend": kernel.sdpa_backend(m.shape, built.device, built.dtype),  # full's SDPA
        "matmul_peak_gflops_per_s": None,  # measured in the kernel's rounds, if it is timed
    }


def training(m: Measuring) -> dict[str, Any]:
    """Training first, on the freshly seeded model, so every variant starts from the same
    state; a curriculum trains the same model at shorter lengths first
    (experiments/training/stages.py)."""
    built = m.built
    columns, m.trained = train_stages(
        m.job, built.model, built.task, built.device, built.precision,
        before=m.columns, on_step=m.on_step, on_stage=m.on_stage,
    )  # fmt: skip
    return columns


def key_blind(m: Measuring) -> dict[str, Any]:
    """Whether a trained state model is in the key-blind trap (experiments/measurement/
    diagnostics.py): on accuracy tasks only."""
    if not (m.built.task.has_accuracy and m.trained.steps):
        return {}
    built = m.built
    return kernel_input_columns(built.model, built.task, built.device, built.precision)


def decode_state(m: Measuring) -> dict[str, Any]:
    """`measure.decode_state` (without `measure.decode`, which measures it too): the decoder's
    state alone, untimed; before a mixture's points, so that every count's record has it."""
    built, m_cfg = m.built, m.job.measure
    if not m_cfg.decode_state or m_cfg.decode:
        return {}
    scope, kv_heads = m_cfg.decode_scope, built.model.config.kv_heads
    with built.precision.autocast():
        return state_columns(
            built.kernel, built.model, m.shape, built.device, built.dtype,
            scope=scope, kv_heads=kv_heads,
        )  # fmt: skip


def mixture(m: Measuring) -> dict[str, Any]:
    """A recall mixture's other counts, each its own record through `on_stage`."""
    if m.on_stage is not None and m.job.train.steps:
        built = m.built
        points = mixture_points(
            m.job, built.model, built.task, built.device, built.precision, m.trained
        )
        for point, columns_at in points:
            m.on_stage(point, {**m.columns, **columns_at, "trained_steps": m.trained.steps})
    return {}


def other_kernels(m: Measuring) -> dict[str, Any]:
    """The trained model evaluated with each of `job.eval_attention`'s kernels."""
    columns = {}
    for label, attention in m.job.eval_attention.items():
        columns.update(
            evaluate_with_kernel(
                m.built, attention, label, seed=m.job.seed, eval_batches=m.job.train.eval_batches
            )
        )
    return columns


def kernel_time(m: Measuring) -> dict[str, Any]:
    """The kernel alone: forward and forward+backward in rounds against exact attention and the
    matmul (`kernel_rounds.round_timings`), its FLOPs and FLOP rates. Its inputs are drawn here
    whenever the kernel is timed or its memory taken, so later draws see the same RNG stream."""
    built, m_cfg = m.built, m.job.measure
    kernel, device, dtype = built.kernel, built.device, built.dtype
    kv_heads = built.model.config.kv_heads  # k, v of fewer heads than q under n_kv_heads
    if m_cfg.kernel or m_cfg.memory:
        m.kernel_fwd, m.kernel_fwd_bwd = kernel_calls(kernel, m.shape, device, dtype, kv_heads)
    if not m_cfg.kernel:
        return {}
    with built.precision.autocast():  # interleaved with exact attention and the matmul
        kernel_times, columns = round_timings(
            kernel, m.kernel_fwd, m.kernel_fwd_bwd, m.shape, device, dtype, m_cfg,
            kv_heads=kv_heads,
        )  # fmt: skip
    m.timings.update(kernel_times)
    columns.update(timing_columns(m.timings))
    if "attn_fwd_bwd_ms" not in m.timings:  # a forward-only kernel (impl=flex on CPU)
        columns.update(attn_fwd_bwd_ms=None, attn_fwd_bwd_iqr_ms=None)  # not measured
    fwd_flops = kernel.flops(*m.shape)
    columns["attn_fwd_flops"] = fwd_flops
    columns["attn_fwd_bwd_flops"] = int(fwd_flops * FWD_BWD_FLOP_FACTOR)
    columns["attn_fwd_gflops_per_s"] = fwd_flops / columns["attn_fwd_ms"] / 1e6
    if "attn_fwd_bwd_ms" in m.timings:  # not for a forward-only kernel
        columns["attn_fwd_bwd_gflops_per_s"] = (
            columns["attn_fwd_bwd_flops"] / columns["attn_fwd_bwd_ms"] / 1e6
        )
    return columns


def step_time(m: Measuring) -> dict[str, Any]:
    """One whole training step (forward, loss, backward, AdamW) timed."""
    built = m.built
    m.step = training_step(built.model, built.task, built.device, built.precision)
    if not m.job.measure.step:
        return {}
    timing = {"min_run_time_s": m.job.measure.min_run_time_s, "warmup": m.job.measure.warmup}
    m.timings["step_ms"] = time_call(m.step, built.device, **timing)
    return timing_columns({"step_ms": m.timings["step_ms"]})


def timing_warning(m: Measuring) -> dict[str, Any]:
    """A figure whose blocks spread widely is flagged, not silently recorded as a fact; so are
    the matmul rate's spread and a FLOP fraction above the machine's matmul (round_timings)."""
    warnings = (spread_warnings(m.timings), m.columns.pop("_matmul_warning", None))
    return {"timing_warning": "; ".join(w for w in warnings if w) or None}


def memory(m: Measuring) -> dict[str, Any]:
    """The training step's peak memory and the kernel's own share of it."""
    if not m.job.measure.memory:
        return {}
    device = m.built.device
    m.step()  # optimiser state exists before the measured step, as in steady-state training
    columns = {"peak_memory_bytes": peak_memory_bytes(m.step, device)}
    if m.kernel_fwd_bwd is not None:
        # The kernel's own share, measured the same way: what it saves for the backward, its
        # output and the inputs' gradients, without the rest of the model around it.
        with m.built.precision.autocast():
            m.kernel_fwd_bwd()  # first-call allocations (caches, buckets) are not the peak
            columns["attn_fwd_bwd_peak_bytes"] = peak_memory_bytes(m.kernel_fwd_bwd, device)
    return columns


def approximation(m: Measuring) -> dict[str, Any]:
    """The kernel's error against exact attention (experiments/measurement/approximation.py)."""
    return approx_columns(m.job, m.built, m.shape) if m.job.measure.approx_error else {}


def decode(m: Measuring) -> dict[str, Any]:
    """What decoding costs: the kernel's cache alone, or every layer's (`measure.decode_scope`)."""
    job, built, m_cfg = m.job, m.built, m.job.measure
    if not m_cfg.decode:
        return {}
    steps = {"steps": m_cfg.decode_steps, "warmup": m_cfg.warmup}
    kv_heads = built.model.config.kv_heads
    with built.precision.autocast():
        if m_cfg.decode_scope == "model":  # every layer through its own cache
            return measure_model_decode(
                built.model, job.batch_size, job.seq_len, built.device, **steps
            )
        return measure_decode(
            built.kernel, m.shape, built.device, built.dtype, kv_heads=kv_heads, **steps
        )


def process_memory(m: Measuring) -> dict[str, Any]:
    """The process's peak resident memory, at the end of everything else."""
    return {"peak_rss_bytes": peak_rss_bytes()}


# In this order: training first, on the freshly seeded model; the kernel's inputs drawn before
# the step is built; the warning after every timing; the process's peak last.
MEASUREMENTS: tuple[Callable[[Measuring], dict[str, Any]], ...] = (
    environment,
    training,
    key_blind,
    decode_state,
    mixture,
    other_kernels,
    kernel_time,
    step_time,
    timing_warning,
    memory,
    approximation,
    decode,
    process_memory,
)


def measure(
    job: JobConfig,
    built: Setup,
    on_step: OnStep | None = None,
    on_stage: OnStage | None = None,
) -> dict[str, Any]:
    """Measure one configuration; returns the measurement columns (units in the names): each of
    `MEASUREMENTS` in turn, each seeing the columns before it.

    `on_step(metrics, step)` gets every training step's metrics (steps counted across the
    stages of a curriculum); `on_stage(stage, columns)` gets the training columns of each
    curriculum stage before the last, as soon as it ends, so the caller can record it.
    """
    m = Measuring(job, built, on_step, on_stage)
    for measurement in MEASUREMENTS:
        m.columns.update(measurement(m))
    return m.columns


def evaluate_with_kernel(
    built: Setup, attention: Mapping[str, Any], label: str, *, seed: int, eval_batches: int
) -> dict[str, float]:
    """Evaluate the built model on its task, on its device and in its precision, with every
    layer's kernel replaced by `attention`, then restore it.

    attention: {"name": variant, **kernel options}, e.g. {"name": "lsh", "n_hashes": 8}. The
    projections stay as trained, as in the Reformer's Table 2 (train with one attention,
    evaluate with another; `TransformerLM.kernels_replaced`). Returns `eval_loss@<label>`, and
    `eval_accuracy@<label>` or `eval_bits_per_byte@<label>` when the task has them, over
    `eval_batches` batches. Stochastic kernels (LSH) draw from a generator seeded with `seed`,
    so the columns are reproducible; the global RNG stream is left as it was. A kernel the
    layers refuse raises `ValueError`.
    """
    model, task, device = built.model, built.task, built.device
    options = {k: v for k, v in attention.items() if k != "name"}
    with (
        model.kernels_replaced(attention["name"], options),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
    ):
        torch.manual_seed(seed)
        loss, accuracy = evaluate(model, task, device, eval_batches, built.precision)
    columns = {f"eval_loss@{label}": loss}
    if task.has_accuracy:
        columns[f"eval_accuracy@{label}"] = accuracy
    if task.reports_bits_per_byte:
        columns[f"eval_bits_per_byte@{label}"] = loss / math.log(2)
    return columns


def training_step(model, task, device, precision: Precision = FLOAT32) -> Callable[[], None]:
    """One full optimiser step (forward, loss, backward, AdamW update) on a fixed batch."""
    batch = task.batch("train", 0).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = precision.grad_scaler()

    def step():
        with precision.autocast():
            loss = training_loss(model, batch)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)  # at the end, as the kernel's calls (kernel_calls)

    return step
