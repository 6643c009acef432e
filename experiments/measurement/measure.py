"""What one job measures, the same way for every variant.

`setup(job)` builds the task and the model a job's `experiments.job_config.JobConfig` describes;
`measure(job, built)` trains the model on the task, then times the attention kernel alone and
the whole training step, takes the step's peak memory, the kernel's analytic FLOPs, its
approximation error against exact attention (experiments/measurement/approximation.py) and,
with `measure.decode`, what decoding costs (experiments/measurement/decode_cost.py). It returns the
measurement columns of the record; the job (experiments/app/job.py `run_job`) adds identity,
status and provenance.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import nn

import variants
from experiments.job_config import JobConfig, MeasureConfig
from experiments.measurement.approximation import approx_columns
from experiments.measurement.decode_cost import measure_decode, measure_model_decode, state_columns
from experiments.measurement.diagnostics import kernel_input_columns
from experiments.measurement.memory import peak_memory_bytes, peak_rss_bytes
from experiments.measurement.timing import (
    FRACTION_WARNING,
    SPREAD_WARNING,
    YARDSTICK_S,
    Timing,
    matmul_call,
    matmul_flops,
    round_timer,
    spread_warnings,
    time_call,
    timed_against,
)
from experiments.training import curriculum, progress
from experiments.training.precision import FLOAT32, Precision
from experiments.training.tasks import Task, build_task
from experiments.training.train import (
    TrainingRun,
    evaluate,
    start_run,
    train,
    training_loss,
    validation_points,
)
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR, Attention, sample_gates


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


def measure(
    job: JobConfig,
    built: Setup,
    on_step: Callable[[dict[str, Any], int], None] | None = None,
    on_stage: Callable[[curriculum.Stage, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure one configuration; returns the measurement columns (units in the names).

    `on_step(metrics, step)` gets every training step's metrics (steps counted across the
    stages of a curriculum); `on_stage(stage, columns)` gets the training columns of each
    curriculum stage before the last, as soon as it ends, so the caller can record it.
    """
    device, dtype, task, model = built.device, built.dtype, built.task, built.model
    precision, kernel, m_cfg = built.precision, built.kernel, job.measure
    shape = kernel_shape(job, model)
    columns: dict[str, Any] = {
        "device": device.type,
        "precision": precision.label,
        "threads": torch.get_num_threads(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "kernel_path": kernel.kernel_path(device, dtype),
        "sdpa_backend": kernel.sdpa_backend(shape, device, dtype),  # None but for full's SDPA
        "matmul_peak_gflops_per_s": None,  # measured in the kernel's rounds, if it is timed
    }

    # Training first, on the freshly seeded model, so every variant starts from the same state;
    # a curriculum trains the same model at shorter lengths first
    # (experiments/training/curriculum.py). One optimizer state and one learning-rate schedule over
    # every stage: a later length continues the run, it does not restart it
    # (experiments/training/train.py, `TrainingRun`).
    stages = job.stages
    run = start_run(model, job.train, sum(stage.steps for stage in stages), precision)
    trained_steps = 0
    bar = progress.TrainingBar(
        sum(stage.steps for stage in stages),
        f"{job.attention['name']} L={job.seq_len}",
        on=progress.enabled(job.train.progress),
    )
    for number, stage in enumerate(stages):
        if stage.steps == 0:
            continue
        last = number == len(stages) - 1
        stage_task = (
            task
            if last
            else build_task(
                job.task, seq_len=stage.seq_len, batch_size=stage.batch_size, seed=job.seed
            )
        )
        result = train(
            model,
            stage_task,
            device,
            dataclasses.replace(job.train, steps=stage.steps),
            on_step=_after(on_step, bar, trained_steps, stage.seq_len if len(stages) > 1 else None),
            precision=precision,
            run=run,
        )
        bar.skip(stage.steps - result.steps)  # a stage stopped early (train.stop_accuracy ...)
        trained_steps += result.steps
        trained = _training_columns(result, stage_task, run)
        trained["trained_steps"] = trained_steps
        if len(stages) > 1:
            trained["curriculum_stage"] = number
        if last:
            columns.update(trained)
        elif on_stage is not None:
            on_stage(stage, {**columns, **trained})
    bar.close()
    if task.has_accuracy and trained_steps:  # is a state model in the key-blind trap?
        columns.update(kernel_input_columns(model, task, device, precision))
    if m_cfg.decode_state and not m_cfg.decode:  # before the mixture's points: theirs too
        scope, kv_heads = m_cfg.decode_scope, model.config.kv_heads
        with precision.autocast():
            columns.update(
                state_columns(kernel, model, shape, device, dtype, scope=scope, kv_heads=kv_heads)
            )
    if on_stage is not None and job.train.steps:
        for point, columns_at in mixture_points(job, built, result, run):
            on_stage(point, {**columns, **columns_at, "trained_steps": trained_steps})
    for label, attention in job.eval_attention.items():
        columns.update(
            evaluate_with_kernel(
                built, attention, label, seed=job.seed, eval_batches=job.train.eval_batches
            )
        )

    timing = {"min_run_time_s": m_cfg.min_run_time_s, "warmup": m_cfg.warmup}
    timings: dict[str, Timing] = {}
    # The kernel's own inputs (and their gradients) only when something measures the kernel.
    kv_heads = model.config.kv_heads  # k, v of fewer heads than q under model.n_kv_heads
    kernel_fwd, kernel_fwd_bwd = (
        _kernel_calls(kernel, shape, device, dtype, kv_heads)
        if m_cfg.kernel or m_cfg.memory
        else (None, None)
    )
    if m_cfg.kernel:
        with precision.autocast():  # interleaved with exact attention and the matmul
            kernel_times, in_rounds = round_timings(
                kernel, kernel_fwd, kernel_fwd_bwd, shape, device, dtype, m_cfg, kv_heads=kv_heads
            )
        timings.update(kernel_times)
        columns.update(in_rounds)
        columns.update(_timing_columns(timings))
        if "attn_fwd_bwd_ms" not in timings:  # a forward-only kernel (impl=flex on CPU)
            columns.update(attn_fwd_bwd_ms=None, attn_fwd_bwd_iqr_ms=None)  # not measured
        fwd_flops = kernel.flops(*shape)
        columns["attn_fwd_flops"] = fwd_flops
        columns["attn_fwd_bwd_flops"] = int(fwd_flops * FWD_BWD_FLOP_FACTOR)
        columns["attn_fwd_gflops_per_s"] = fwd_flops / columns["attn_fwd_ms"] / 1e6
        if "attn_fwd_bwd_ms" in timings:  # not for a forward-only kernel
            columns["attn_fwd_bwd_gflops_per_s"] = (
                columns["attn_fwd_bwd_flops"] / columns["attn_fwd_bwd_ms"] / 1e6
            )

    step = _training_step(model, task, device, precision)
    if m_cfg.step:
        timings["step_ms"] = time_call(step, device, **timing)
        columns.update(_timing_columns({"step_ms": timings["step_ms"]}))
    # A figure whose blocks spread widely is flagged, not silently recorded as a fact; so are
    # the matmul rate's spread and a FLOP fraction above the machine's matmul (round_timings).
    warnings = (spread_warnings(timings), columns.pop("_matmul_warning", None))
    columns["timing_warning"] = "; ".join(w for w in warnings if w) or None
    if m_cfg.memory:
        step()  # optimiser state exists before the measured step, as in steady-state training
        columns["peak_memory_bytes"] = peak_memory_bytes(step, device)
        if kernel_fwd_bwd is not None:
            # The kernel's own share, measured the same way: what it saves for the backward,
            # its output and the inputs' gradients, without the rest of the model around it.
            with precision.autocast():
                kernel_fwd_bwd()  # first-call allocations (caches, buckets) are not the peak
                columns["attn_fwd_bwd_peak_bytes"] = peak_memory_bytes(kernel_fwd_bwd, device)
    if m_cfg.approx_error:
        columns.update(approx_columns(job, built, shape))
    if m_cfg.decode:
        decode = {"steps": m_cfg.decode_steps, "warmup": m_cfg.warmup}
        with precision.autocast():
            if m_cfg.decode_scope == "model":  # every layer through its own cache
                columns.update(
                    measure_model_decode(model, job.batch_size, job.seq_len, device, **decode)
                )
            else:
                columns.update(
                    measure_decode(kernel, shape, device, dtype, kv_heads=kv_heads, **decode)
                )
    columns["peak_rss_bytes"] = peak_rss_bytes()
    return columns


def mixture_points(job: JobConfig, built: Setup, result, run: TrainingRun) -> Iterator[tuple]:
    """A recall mixture's evaluation points: for each count of `task.train_pairs` but the job's
    own `n_pairs` (its record), the trained model's training columns with the evaluation at that
    count, as a 0-step `curriculum.Stage` whose task options say the count (so the record is
    the job's config at that n_pairs). Nothing for other tasks."""
    counts = getattr(built.task, "train_pairs", None) or ()
    # The last validation at each point, in `validation_points`' order (the job's count first).
    points = [p.n_pairs for p in validation_points(built.task)] if counts else []
    valid = dict(zip(points, result.valid or [], strict=False))  # none if it never trained
    for count in counts:
        if count == built.task.n_pairs:
            continue
        task = built.task.at_pairs(count)
        final = evaluate(
            built.model,
            task,
            built.device,
            job.train.eval_batches,
            built.precision,
            min_pairs=job.train.eval_pairs,
        )
        at = dataclasses.replace(
            result,
            eval_loss=final.loss,
            eval_accuracy=final.accuracy,
            final_eval=final,
            valid=[valid[count]] if count in valid else None,
        )
        point = curriculum.Stage(job.seq_len, job.batch_size, 0, task=(("n_pairs", count),))
        yield point, _training_columns(at, task, run)


def _training_columns(result, task: Task, run: TrainingRun) -> dict[str, Any]:
    columns = {
        "train_loss": result.train_loss,
        "eval_loss": result.eval_loss,
        "eval_accuracy": result.eval_accuracy,
        "tokens_per_s": result.tokens_per_s,
        "train_stop": result.stop,
    }
    # The last validation at this record's point (what a grid chooses on), recorded only where
    # it is held out from what is reported (a byte task without `valid_fraction` validates on
    # its eval split).
    if result.valid and getattr(task, "validation_split", "valid") != "eval":
        columns["valid_loss"] = result.valid[0].loss
        if task.has_accuracy:
            columns["valid_accuracy"] = result.valid[0].accuracy
    if result.grad_warning is not None:  # float16 gradients that underflowed or overflowed
        columns["grad_warning"] = result.grad_warning
    if task.has_accuracy:
        # Learned so far: the job's own (last) record says it for the whole run.
        columns.update(learned=run.steps_to_learn is not None, steps_to_learn=run.steps_to_learn)
    final = result.final_eval
    if final is not None and final.floor_accuracy is not None:
        low, high = final.accuracy_ci
        columns.update(
            chance_accuracy=task.chance_accuracy,
            floor_accuracy=final.floor_accuracy,
            eval_accuracy_ci_low=low,
            eval_accuracy_ci_high=high,
            eval_distinct_pairs=final.distinct_pairs,
        )
    if task.reports_bits_per_byte:
        columns["eval_bits_per_byte"] = result.eval_loss / math.log(2)
    return columns


def _after(on_step, bar: progress.TrainingBar, offset: int, seq_len: int | None):
    """on_step with steps counted from `offset` and, in a curriculum, the stage's length; each
    step also advances the progress bar."""

    def shifted(metrics: dict[str, Any], step: int) -> None:
        if seq_len is not None:
            metrics = {**metrics, "train/seq_len": seq_len}
        bar.advance(metrics)
        if on_step is not None:
            on_step(metrics, offset + step)

    return shifted


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


def _kernel_calls(
    kernel, shape, device, dtype, kv_heads: int | None = None
) -> tuple[Callable, Callable | None]:
    """The kernel alone on random q of `shape` and k, v of `kv_heads` heads (default q's):
    a forward (no grad) and, unless the kernel runs forward only on `device` (impl=flex on
    CPU), a forward+backward that also allocates the inputs' gradients, as a training step
    does, and releases them (and the kernel's parameters' gradients) before it returns."""
    kv_shape = (shape[0], shape[1] if kv_heads is None else kv_heads, *shape[2:])
    q = torch.randn(shape, device=device, dtype=dtype)
    k, v = (torch.randn(kv_shape, device=device, dtype=dtype) for _ in range(2))
    gates = sample_gates(kernel, q)  # None unless the kernel is gated (NSA, DeltaNet)

    def fwd():
        with torch.no_grad():
            kernel(q, k, v, gates=gates)

    if not kernel.supports_backward(device):
        return fwd, None
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))  # k, v: (B, H_kv, L, D)
    grad_out = torch.randn(shape, device=device, dtype=dtype)

    def fwd_bwd():
        kernel(qg, kg, vg, gates=gates).backward(grad_out)
        # Released at the end, not the start: a call frees nothing that was live before it, so
        # its peak memory is the same quantity on CPU and CUDA (memory.py).
        for t in (qg, kg, vg):
            t.grad = None
        kernel.zero_grad(set_to_none=True)

    return fwd, fwd_bwd


def round_timings(
    kernel: Attention,
    fwd: Callable[[], None],
    fwd_bwd: Callable[[], None] | None,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
    m_cfg: MeasureConfig,
    clock: Callable[[], float] = time.perf_counter,
    kv_heads: int | None = None,
) -> tuple[dict[str, Timing], dict[str, Any]]:
    """The kernel's forward and forward+backward, each timed in `m_cfg.rounds` rounds that
    alternate with exact attention (`full`) at the same shape (batch, heads, seq_len,
    head_dim), device, dtype and threads: its `sdpa` form in both passes and every other
    `m_cfg.speedup_vs` form (`math`: explicit L×L scores) in forward+backward (none with
    `speedup_vs` empty); the last pass also with the machine's matmul (`m_cfg.matmul_size`,
    `YARDSTICK_S` per round) right after the kernel in every round.

    Exact attention is causal iff the kernel is, so a bidirectional job is compared with
    bidirectional SDPA. A shared-QK kernel (lsh, routing) is compared with plain SDPA of the
    same shape, not with shared-QK exact attention: the question is what the kernel costs
    against the fused kernel a model would otherwise call. Each round gives every contender
    `m_cfg.warmup` untimed calls the first time, then `m_cfg.min_run_time_s / m_cfg.rounds`
    seconds (one block at least). Returns the kernel's timings (`attn_fwd_ms`,
    `attn_fwd_bwd_ms`: median and IQR over rounds) and the columns `[fwd_]speedup_vs_<impl>`
    (median over rounds of exact's time / the kernel's in the same round), their `_iqr`,
    `speedup_rounds`, `matmul_peak_gflops_per_s` (the matmul's median over rounds),
    `attn_fwd_bwd_matmul_fraction` (median over rounds of the kernel's useful FLOP/s / the
    matmul's in that round) and `matmul_fraction_warning`. `clock` (seconds) is for tests.
    `kv_heads`: the heads of the kernel's k and v (grouped KV heads; default q's): exact
    attention runs on the same grouped inputs (SDPA's `enable_gqa`), as a model would call it.
    """
    time_one = round_timer(
        device,
        min_run_time_s=(m_cfg.min_run_time_s or 0.0) / m_cfg.rounds,
        warmup=m_cfg.warmup,
        clock=clock,
    )
    time_yardstick = round_timer(device, min_run_time_s=YARDSTICK_S, warmup=1, clock=clock)
    passes = [("attn_fwd_ms", "fwd_", fwd, [i for i in m_cfg.speedup_vs if i == "sdpa"])]
    if fwd_bwd is not None:
        passes.append(("attn_fwd_bwd_ms", "", fwd_bwd, list(m_cfg.speedup_vs)))
    timings: dict[str, Timing] = {}
    columns: dict[str, Any] = {"speedup_rounds": m_cfg.rounds} if m_cfg.speedup_vs else {}
    for number, (name, prefix, mine, impls) in enumerate(passes):
        references = {}
        for impl in impls:
            exact = variants.build_attention("full", causal=kernel.causal, impl=impl).to(device)
            exact_fwd, exact_fwd_bwd = _kernel_calls(exact, shape, device, dtype, kv_heads)
            references[impl] = exact_fwd if prefix else exact_fwd_bwd
        # A fresh matmul in every job, timed in its rounds: no rate is kept across jobs.
        last = number == len(passes) - 1
        yardstick = matmul_call(m_cfg.matmul_size, device, dtype) if last else None
        timings[name], ratios, matmul = timed_against(
            mine,
            references,
            rounds=m_cfg.rounds,
            time_one=time_one,
            yardstick=yardstick,
            time_yardstick=time_yardstick,
            clock=clock,
        )
        for impl, r in ratios.items():
            columns[f"{prefix}speedup_vs_{impl}"] = r.median
            columns[f"{prefix}speedup_vs_{impl}_iqr"] = r.iqr
        if matmul is not None:
            columns.update(_fraction_columns(kernel, shape, matmul, m_cfg.matmul_size, prefix))
    return timings, columns


def _fraction_columns(kernel, shape, matmul, size: int, prefix: str) -> dict[str, Any]:
    """The matmul rate of the kernel's rounds (GFLOP/s) and, for forward+backward (`prefix`
    ""), the FLOP fraction: per round (kernel FLOPs / its time) / (matmul FLOPs / its time),
    which is the round's time ratio matmul / kernel times the FLOP ratio, so its median is that
    ratio's median scaled. A wide matmul spread or a fraction above `FRACTION_WARNING` leaves
    a warning in `_matmul_warning` (measure joins it into `timing_warning`)."""
    timing = matmul.timing
    columns: dict[str, Any] = {
        "matmul_peak_gflops_per_s": matmul_flops(size) / timing.median_ms / 1e6
    }
    notes = []
    if timing.spread > SPREAD_WARNING:
        notes.append(
            f"matmul_peak_gflops_per_s IQR {timing.spread:.0%} of its median over "
            f"{timing.blocks} rounds"
        )
    if not prefix:  # forward+backward: a forward-only kernel has no fraction
        flops = kernel.flops(*shape) * FWD_BWD_FLOP_FACTOR
        fraction = matmul.per_kernel.median * flops / matmul_flops(size)
        columns["attn_fwd_bwd_matmul_fraction"] = fraction
        columns["matmul_fraction_warning"] = bool(fraction > FRACTION_WARNING)
        if fraction > FRACTION_WARNING:
            notes.append(
                f"attn_fwd_bwd_matmul_fraction {fraction:.2f} > {FRACTION_WARNING} of the matmul "
                "timed in the same rounds: a kernel cannot outrun the machine's matmul"
            )
    if notes:
        columns["_matmul_warning"] = "; ".join(notes)
    return columns


def _timing_columns(timings: dict[str, Timing]) -> dict[str, float]:
    """`<name>_ms` -> its median, and `<name>_iqr_ms` its interquartile range."""
    columns = {}
    for name, t in timings.items():
        columns[name], columns[name.removesuffix("_ms") + "_iqr_ms"] = t.median_ms, t.iqr_ms
    return columns


def _training_step(model, task, device, precision: Precision = FLOAT32) -> Callable[[], None]:
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
        optimizer.zero_grad(set_to_none=True)  # at the end, as the kernel's calls (_kernel_calls)

    return step
