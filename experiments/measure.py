"""What one job measures, the same way for every variant.

`measure(config)` builds the model from a resolved config, trains it on the task, then times the
attention kernel alone and the whole training step, takes the step's peak memory, the kernel's
analytic FLOPs and its approximation error against exact attention. It returns the measurement
columns of the record; `experiments.run` adds identity, status and provenance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

import variants
import variants.layers
from experiments import curriculum, reference_model
from experiments.memory import peak_memory_bytes, peak_rss_bytes
from experiments.precision import FLOAT32, Precision
from experiments.tasks import Task, build_task
from experiments.timing import Timing, matmul_gflops_per_s, spread_warnings, time_call
from experiments.train import evaluate, masked_loss_and_hits, train
from variants.attention.base import FWD_BWD_FLOP_FACTOR, Attention
from variants.checks import require_non_negative_int, require_positive_int


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cuda` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"option 'device' must be one of auto, cpu, cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("option 'device'=cuda but torch sees no CUDA device")
    return torch.device(name)


def resolve_shared_qk(config: dict[str, Any]) -> bool:
    """`model.shared_qk`, null resolved: as the attention variant requires."""
    shared_qk = config["model"]["shared_qk"]
    if shared_qk is None:
        return variants.attention_spec(config["attention"]["name"]).shared_qk_required
    return shared_qk


def build_model(config: dict[str, Any], vocab_size: int) -> torch.nn.Module:
    """The TransformerLM a config describes (ValueErrors from the registry pass through)."""
    attention = dict(config["attention"])
    name = attention.pop("name")
    model_cfg = config["model"]
    return variants.TransformerLM(
        vocab_size=vocab_size,
        d_model=model_cfg["d_model"],
        n_heads=model_cfg["n_heads"],
        depth=model_cfg["depth"],
        ff_mult=model_cfg["ff_mult"],
        dropout=model_cfg["dropout"],
        ff_chunks=model_cfg["ff_chunks"],
        max_seq_len=config["seq_len"],
        attention=name,
        attention_options=attention,
        block=config["block"]["name"],
        shared_qk=model_cfg["shared_qk"],
        causal=model_cfg["causal"],
        token_shift=model_cfg["token_shift"],
    )


def first_kernel(model: torch.nn.Module) -> Attention:
    return next(m for m in model.modules() if isinstance(m, Attention))


@dataclass
class Setup:
    """Everything a configuration builds before anything is measured."""

    device: torch.device
    precision: Precision
    task: Task
    model: torch.nn.Module

    @property
    def dtype(self) -> torch.dtype:
        """The compute type: what activations and the kernels' inputs are."""
        return self.precision.compute_dtype


POSITIVE_INTS = (
    "seq_len",
    "batch_size",
    "measure.approx_seeds",
    "measure.matmul_size",
    "train.eval_batches",
)
NON_NEGATIVE_INTS = ("train.steps", "train.warmup", "train.eval_every", "measure.warmup")
POSITIVE_OR_NULL = ("measure.min_run_time_s", "budget.max_memory_gb", "budget.max_seconds")


def check_sizes(config: dict[str, Any]) -> None:
    """The runner's own size options, checked before anything is built or measured."""

    def value(key: str) -> Any:
        node = config
        for part in key.split("."):
            node = node[part]
        return node

    for key in POSITIVE_INTS:
        require_positive_int("config", key, value(key))
    for key in NON_NEGATIVE_INTS:
        require_non_negative_int("config", key, value(key))
    for key in POSITIVE_OR_NULL:
        number = value(key)
        if number is not None and (
            isinstance(number, bool) or not isinstance(number, (int, float)) or number <= 0
        ):
            raise ValueError(
                f"config: option {key!r} must be a positive number or null, got {number!r}"
            )


def setup(config: dict[str, Any]) -> Setup:
    """Validate and build a configuration; bad options raise `ValueError` naming the key."""
    device = resolve_device(config["device"])
    precision = Precision.of(config["dtype"], device)
    if config["threads"]:
        torch.set_num_threads(int(config["threads"]))
    check_sizes(config)
    curriculum.stages_of(config)  # a bad schedule is a config error, before anything is built
    seq_len, batch_size, seed = config["seq_len"], config["batch_size"], config["seed"]
    torch.manual_seed(seed)
    task = build_task(config["task"], seq_len=seq_len, batch_size=batch_size, seed=seed)
    # float32 master weights whatever the dtype: half types are autocast (experiments/precision).
    model = build_model(config, task.vocab_size).to(device=device)
    check_backward(config, first_kernel(model), device)
    return Setup(device, precision, task, model)


def check_backward(config: dict[str, Any], kernel: Attention, device: torch.device) -> None:
    """A kernel that runs forward only on `device` (`impl=flex` on CPU) can only be timed
    forward: refuse a job that would train it or time or measure a training step."""
    if kernel.supports_backward(device):
        return
    needs = [
        key
        for key, on in (
            ("train.steps", config["train"]["steps"] > 0),
            ("measure.step", config["measure"]["step"]),
            ("measure.memory", config["measure"]["memory"]),
        )
        if on
    ]
    if needs:
        name = config["attention"]["name"]
        raise ValueError(
            f"attention {name!r}: option impl='flex' runs forward only on {device.type} "
            f"(PyTorch's FlexAttention has no CPU backward), but {', '.join(needs)} need a "
            "backward; use attention.impl=native to train, or train.steps=0 "
            "measure.step=false measure.memory=false to time its forward"
        )


def measure(
    config: dict[str, Any],
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
    precision = built.precision
    seq_len, batch_size = config["seq_len"], config["batch_size"]
    m_cfg, t_cfg = config["measure"], config["train"]
    kernel = first_kernel(model)
    n_heads = config["model"]["n_heads"]
    head_dim = config["model"]["d_model"] // n_heads
    columns: dict[str, Any] = {
        "device": device.type,
        "precision": precision.label,
        "threads": torch.get_num_threads(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "matmul_peak_gflops_per_s": matmul_gflops_per_s(str(device), dtype, m_cfg["matmul_size"]),
    }

    # Training first, on the freshly seeded model, so every variant starts from the same state;
    # a curriculum trains the same model at shorter lengths first (experiments/curriculum.py).
    stages = curriculum.stages_of(config)
    trained_steps = 0
    for number, stage in enumerate(stages):
        if stage.steps == 0:
            continue
        last = number == len(stages) - 1
        stage_task = (
            task
            if last
            else build_task(
                config["task"],
                seq_len=stage.seq_len,
                batch_size=stage.batch_size,
                seed=config["seed"],
            )
        )
        result = train(
            model,
            stage_task,
            device,
            steps=stage.steps,
            lr=t_cfg["lr"],
            warmup=t_cfg["warmup"],
            weight_decay=t_cfg["weight_decay"],
            grad_clip=t_cfg["grad_clip"],
            eval_every=t_cfg["eval_every"],
            eval_batches=t_cfg["eval_batches"],
            on_step=_after(on_step, trained_steps, stage.seq_len if len(stages) > 1 else None),
            progress=t_cfg["progress"],
            precision=precision,
        )
        trained_steps += stage.steps
        trained = _training_columns(result, stage_task)
        if len(stages) > 1:
            trained.update(curriculum_stage=number, trained_steps=trained_steps)
        if last:
            columns.update(trained)
        elif on_stage is not None:
            on_stage(stage, {**columns, **trained})
    eval_attention = (config.get("eval") or {}).get("attention") or {}
    for label, attention in eval_attention.items():
        columns.update(
            evaluate_with_kernel(model, task, device, attention, label, config, precision)
        )

    timing = {"min_run_time_s": m_cfg["min_run_time_s"], "warmup": m_cfg["warmup"]}
    shape = (batch_size, n_heads, seq_len, head_dim)
    timings: dict[str, Timing] = {}
    if m_cfg["kernel"]:
        with precision.autocast():
            timings.update(_kernel_timings(kernel, shape, device, dtype, timing))
        columns.update(_timing_columns(timings))
        if "attn_fwd_bwd_ms" not in timings:  # a forward-only kernel (impl=flex on CPU)
            columns.update(attn_fwd_bwd_ms=math.nan, attn_fwd_bwd_iqr_ms=math.nan)
        fwd_flops = kernel.flops(batch_size, n_heads, seq_len, head_dim)
        columns["attn_fwd_flops"] = fwd_flops
        columns["attn_fwd_bwd_flops"] = int(fwd_flops * FWD_BWD_FLOP_FACTOR)
        columns["attn_fwd_gflops_per_s"] = fwd_flops / columns["attn_fwd_ms"] / 1e6
        if "attn_fwd_bwd_ms" in timings:  # not for a forward-only kernel
            columns["attn_fwd_bwd_gflops_per_s"] = (
                columns["attn_fwd_bwd_flops"] / columns["attn_fwd_bwd_ms"] / 1e6
            )
            columns["attn_fwd_bwd_matmul_fraction"] = (
                columns["attn_fwd_bwd_gflops_per_s"] / columns["matmul_peak_gflops_per_s"]
            )

    step = _training_step(model, task, device, precision)
    if m_cfg["step"]:
        timings["step_ms"] = time_call(step, device, **timing)
        columns.update(_timing_columns({"step_ms": timings["step_ms"]}))
    # A figure whose blocks spread widely is flagged, not silently recorded as a fact.
    columns["timing_warning"] = spread_warnings(timings)
    if m_cfg["memory"]:
        step()  # optimiser state exists before the measured step, as in steady-state training
        columns["peak_memory_bytes"] = peak_memory_bytes(step, device)
    if m_cfg["approx_error"]:
        seeds = m_cfg["approx_seeds"]
        reference = reference_model.load_or_train(
            reference_model.ReferenceConfig.of_job(config),
            device,
            reference_model.cache_dir((m_cfg.get("reference") or {}).get("cache_dir")),
        )
        with precision.autocast():
            columns["approx_rel_error"] = approx_rel_error(
                kernel, trained_inputs(reference, shape, device, seeds), device, dtype
            )
        columns["approx_reference_digest"] = reference.digest
        columns["approx_reference_bits_per_byte"] = reference.eval_bits_per_byte
        with precision.autocast():
            columns["approx_rel_error_gaussian"] = approx_rel_error(
                kernel, gaussian_inputs(shape, seeds), device, dtype
            )
    columns["peak_rss_bytes"] = peak_rss_bytes()
    return columns


def _training_columns(result, task: Task) -> dict[str, Any]:
    columns = {
        "train_loss": result.train_loss,
        "eval_loss": result.eval_loss,
        "eval_accuracy": result.eval_accuracy,
        "tokens_per_s": result.tokens_per_s,
    }
    if getattr(task, "reports_bits_per_byte", False):
        columns["eval_bits_per_byte"] = result.eval_loss / math.log(2)
    return columns


def _after(on_step, offset: int, seq_len: int | None):
    """on_step with steps counted from `offset` and, in a curriculum, the stage's length."""
    if on_step is None:
        return None

    def shifted(metrics: dict[str, Any], step: int) -> None:
        if seq_len is not None:
            metrics = {**metrics, "train/seq_len": seq_len}
        on_step(metrics, offset + step)

    return shifted


def evaluate_with_kernel(
    model: torch.nn.Module,
    task: Task,
    device: torch.device,
    attention: dict[str, Any],
    label: str,
    config: dict[str, Any],
    precision: Precision = FLOAT32,
) -> dict[str, float]:
    """Evaluate the model with every layer's kernel replaced by `attention`, then restore it.

    attention: {"name": variant, **kernel options}, e.g. {"name": "lsh", "n_hashes": 8}. The
    projections stay as trained, as in the Reformer's Table 2 (train with one attention,
    evaluate with another). Returns `eval_loss@<label>`, and `eval_accuracy@<label>` or
    `eval_bits_per_byte@<label>` when the task has them. Stochastic kernels (LSH) draw from a
    generator seeded with the config's seed, so the columns are reproducible; the global RNG
    stream is left as it was. A kernel the layers refuse raises `ValueError`.
    """
    options = dict(attention)
    name = options.pop("name")
    layers = [m for m in model.modules() if isinstance(m, variants.layers.SelfAttention)]
    originals = [layer.replace_kernel(name, options) for layer in layers]
    first, *rest = (layer.kernel for layer in layers)
    for kernel in rest:  # as the model ties its own kernels (Linformer's layerwise sharing)
        kernel.tie_to(first)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(config["seed"])
            loss, accuracy = evaluate(
                model, task, device, config["train"]["eval_batches"], precision
            )
    finally:
        for layer, original in zip(layers, originals, strict=True):
            layer.kernel = original
    columns = {f"eval_loss@{label}": loss}
    if task.has_accuracy:
        columns[f"eval_accuracy@{label}"] = accuracy
    if getattr(task, "reports_bits_per_byte", False):
        columns[f"eval_bits_per_byte@{label}"] = loss / math.log(2)
    return columns


def _kernel_timings(kernel, shape, device, dtype, timing) -> dict[str, Timing]:
    """Forward (no grad) and forward+backward times of the kernel alone on random q, k, v."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        fwd = time_call(lambda: kernel(q, k, v), device, **timing)
    if not kernel.supports_backward(device):  # forward only (impl=flex on CPU)
        return {"attn_fwd_ms": fwd}
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn(shape, device=device, dtype=dtype)

    def fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        kernel.zero_grad(set_to_none=True)
        kernel(qg, kg, vg).backward(grad_out)

    return {"attn_fwd_ms": fwd, "attn_fwd_bwd_ms": time_call(fwd_bwd, device, **timing)}


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
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss, _ = masked_loss_and_hits(model(batch.inputs), batch)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    return step


@torch.no_grad()
def approx_rel_error(
    kernel: Attention,
    inputs: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """Mean over `inputs` of ||kernel(q,k,v) - exact|| / ||exact|| (Frobenius).

    inputs: (q, k, v) triples of the kernel's shape (batch, heads, seq_len, head_dim). Exact
    attention is the `full` kernel on the same inputs, causal iff the kernel is. A kernel
    under the Reformer's shared-QK rule (LSH, or one built with `shared_qk=True`) gets k = q and
    is compared with exact shared-QK attention (unit keys, self masked unless alone), so the
    error is what hashing, chunking or the pattern cost, not the convention. Measured in eval
    mode (no centroid or feature updates), in float32 or wider.
    """
    shared_qk = kernel.applies_shared_qk
    exact_kernel = variants.build_attention("full", causal=kernel.causal, shared_qk=shared_qk)
    was_training = kernel.training
    kernel.eval()
    errors = []
    try:
        for q, k, v in inputs:
            q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
            if shared_qk:
                k = q
            out = kernel(q, k, v).float()
            exact = exact_kernel(q, k, v).float()
            errors.append(
                float(torch.linalg.vector_norm(out - exact) / torch.linalg.vector_norm(exact))
            )
    finally:
        kernel.train(was_training)
    return sum(errors) / len(errors)


def gaussian_inputs(shape, seeds: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`seeds` draws of q, k, v from N(0, 1) (CPU, float32), each of `shape`.

    Only for `approx_rel_error_gaussian`: at realistic head sizes exact attention over such
    inputs is nearly uniform, so this error says little about trained models.
    """
    for seed in range(seeds):
        g = torch.Generator(device="cpu").manual_seed(10_000 + seed)
        yield tuple(torch.randn(shape, generator=g) for _ in range(3))


def trained_inputs(
    reference: reference_model.ReferenceModel, shape, device: torch.device, seeds: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q, k, v of every layer of the trained reference model on `seeds` held-out text batches.

    shape: the kernel's (batch, heads, seq_len, head_dim); the reference has the same heads
    and head_dim (`ReferenceConfig.of_job`).
    """
    batch, _, seq_len, _ = shape
    for index in range(seeds):
        yield from reference_model.attention_inputs(
            reference, seq_len=seq_len, batch_size=batch, index=index, device=device
        )
