"""The reference model whose attention inputs approximation error is measured on.

Exact attention over q, k, v drawn from N(0, 1) is nearly uniform at realistic head sizes, so
every approximation looks broken on such inputs (relative errors above 1). What a user cares
about is the error on the queries, keys and values a trained model produces. So a job measures
`approx_rel_error` on the q, k, v of a small language model trained on the `text` task (the
stdlib corpus unless `text_path` says otherwise), run on held-out text at the job's length.

The errors are taken in distribution: the reference uses rotary positions (relative, as
modern LMs do) and, after its stage at `seq_len`, trains a short stage at `long_seq_len` with the
same optimizer and learning-rate schedule, so its `trained_length` covers the lengths the main job
reports. A job longer than that gets no error (`measure.py` records NaN and says why). A shared-QK
kernel is measured on a reference trained with shared QK (`shared_qk`).

A kernel with learned state (parameters, or buffers that a training forward updates: routing's
centroids) is first fitted to the frozen reference (`fit_kernel`): `fit_steps` Adam steps
minimising its relative output error against exact attention on the reference's training-split
q, k, v at the job's length. Scoring it as initialised would measure its initialisation.

Models and fitted kernels are cached under the user's cache directory (`$ATTNBENCH_CACHE_DIR`,
else `$XDG_CACHE_HOME/attnbench`, else `~/.cache/attnbench`) as `reference/<digest>.pt` and
`reference/<digest>/kernel-<key>.pt`. The digest covers every setting that shapes the model
(`ReferenceConfig` and the corpus's size), the key every setting that shapes the fitted kernel,
so a changed config trains a new one; concurrent jobs wait on a file lock (the project's one,
experiments/records/files.py: opened without following symlinks) instead of training twice.
Files are written by the project's one atomic write, durably (fsynced before their rename), and
a cached file that fails to load is moved aside (a warning names it) and rebuilt.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import variants
from experiments.config import JobConfig
from experiments.records import files
from experiments.training.tasks import build_task
from experiments.training.tasks.text import read_corpus
from experiments.training.train import evaluate, train
from experiments.training.train_config import TrainConfig
from variants.attention.common.base import Attention, sample_gates, shared_qk_keys
from variants.checks import require_choice, require_non_negative_int, require_positive_int
from variants.config import POSITIONS
from variants.layers import SelfAttention, build_kernel, kernels_swapped

log = logging.getLogger("attnbench")

CACHE_LOCK_MODE = 0o600  # the cache's lock files: private to the user (less the umask)

# Bump when the training recipe below changes what a cached model is.
RECIPE_VERSION = 2
# Bump when the kernel-fitting recipe changes what a cached fitted kernel is.
FIT_VERSION = 2
# ReferenceConfig fields that shape the fitted kernels only, not the model (not in its digest).
_FIT_FIELDS = ("fit_steps", "fit_lr", "fit_batches", "fit_max_len")


@dataclass(frozen=True)
class ReferenceConfig:
    """How the reference model is built and trained, and how kernels are fitted to it.

    d_model and n_heads follow the job, so its q, k, v have the shape (batch, n_heads, seq_len,
    d_model / n_heads) the job's kernel takes; `shared_qk` follows the job's resolved model
    option. Training: `steps` steps of `batch_size` sequences of `seq_len` tokens, then
    `long_steps` steps at `long_seq_len` (0: none) with as many tokens per step (at least one
    sequence), one AdamW and one warm-up/cosine schedule over both. `positions`: as
    `model.positions`. Fitting (`fit_kernel`): `fit_steps` Adam steps at `fit_lr` cycling over
    `fit_batches` training-split batches of at most `fit_max_len` tokens (0: the job's length)
    for kernels whose learned state does not depend on the length (all but `bounded_length`
    ones such as Linformer, fitted at the job's length).
    """

    d_model: int
    n_heads: int
    depth: int = 2
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 300
    long_seq_len: int = 4096
    long_steps: int = 20
    lr: float = 2e-3
    seed: int = 0
    positions: str = "rotary"
    shared_qk: bool = False
    text_path: str | None = None
    fit_steps: int = 200
    fit_lr: float = 1e-2
    fit_batches: int = 8
    fit_max_len: int = 1024

    def __post_init__(self):
        for name in ("d_model", "n_heads", "depth", "seq_len", "batch_size", "steps"):
            require_positive_int("measure.reference", name, getattr(self, name))
        for name in ("long_seq_len", "long_steps", "fit_steps", "fit_max_len"):
            require_non_negative_int("measure.reference", name, getattr(self, name))
        require_positive_int("measure.reference", "fit_batches", self.fit_batches)
        require_choice("measure.reference", "positions", self.positions, POSITIONS)

    @classmethod
    def of_job(cls, job: JobConfig) -> ReferenceConfig:
        """The reference config of a job: its `measure.reference` options, model width and
        resolved shared QK."""
        options = {k: v for k, v in job.measure.reference.items() if k != "cache_dir"}
        try:
            return cls(
                d_model=job.model["d_model"],
                n_heads=job.model["n_heads"],
                shared_qk=job.shared_qk,
                **options,
            )
        except TypeError as error:
            raise ValueError(f"config: measure.reference: {error}") from None

    @property
    def trained_length(self) -> int:
        """The longest sequence the reference was trained on: its errors hold up to here."""
        return max(self.seq_len, self.long_seq_len if self.long_steps else 0)

    def model_config(self) -> variants.ModelConfig:
        """The reference model: full attention, causal, at this width and depth. The length
        bound is only a guard: `measure.py` takes no error past `trained_length`."""
        return variants.ModelConfig(
            vocab_size=256,
            d_model=self.d_model,
            n_heads=self.n_heads,
            depth=self.depth,
            max_seq_len=2**24,
            attention="full",
            causal=True,
            shared_qk=self.shared_qk,
            positions=self.positions,
        )

    def train_config(self) -> TrainConfig:
        """How it is trained (the recipe of RECIPE_VERSION): one schedule over both stages."""
        steps = self.steps + (self.long_steps if self.long_seq_len else 0)
        return TrainConfig(
            steps=steps,
            lr=self.lr,
            warmup=min(100, steps // 10),
            weight_decay=0.01,
            grad_clip=1.0,
            eval_every=0,
            eval_batches=8,
        )

    def digest(self) -> str:
        """12 hex digits naming the model: the config, the corpus size and the recipe."""
        corpus_bytes = len(read_corpus(self.text_path, "*.py"))
        shaping = {k: v for k, v in dataclasses.asdict(self).items() if k not in _FIT_FIELDS}
        blob = json.dumps(
            {**shaping, "corpus_bytes": corpus_bytes, "recipe": RECIPE_VERSION}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_dir(configured: str | None = None) -> Path:
    """Where reference models live: the option, $ATTNBENCH_CACHE_DIR, or the user cache dir."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("ATTNBENCH_CACHE_DIR"):
        return Path(os.environ["ATTNBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnbench"


@dataclass
class ReferenceModel:
    """A trained reference model and what is known about it."""

    model: variants.TransformerLM
    config: ReferenceConfig
    digest: str
    eval_bits_per_byte: float
    path: Path


def load_or_train(
    config: ReferenceConfig, device: torch.device, directory: Path | None = None
) -> ReferenceModel:
    """The cached reference model of `config`, trained (and cached) first if there is none or
    the cached file fails to load (it is then moved aside, with a warning naming it)."""
    digest = config.digest()
    directory = cache_dir() if directory is None else directory
    path = directory / "reference" / f"{digest}.pt"

    def build() -> dict[str, Any]:
        return _train(config)

    model = variants.TransformerLM(config.model_config())

    def fill(saved: dict[str, Any]) -> None:
        model.load_state_dict(saved["state_dict"])
        float(saved["eval_bits_per_byte"])

    saved = _cached(path, build, required=("state_dict", "eval_bits_per_byte"), load=fill)
    model.to(device).eval()
    for parameter in model.parameters():  # frozen: kernels are fitted to it, never it to them
        parameter.requires_grad_(False)
    return ReferenceModel(model, config, digest, saved["eval_bits_per_byte"], path)


def _cached(
    path: Path,
    build: Callable[[], dict[str, Any]],
    required: tuple[str, ...],
    load: Callable[[dict[str, Any]], None],
) -> dict:
    """The dict saved at `path`, built by `build()` and saved first if missing or damaged;
    `load(saved)` puts it into its model (a `load_state_dict`), and raises if it does not fit.

    Under an exclusive lock on `<path>.lock`, so concurrent jobs build it once. A file that
    fails to load (truncated, not a dict of `required` keys, or tensors that do not fit the
    model: missing or unexpected keys, other shapes) is renamed to `<name>.damaged-<time>`, a
    warning names both paths, and it is rebuilt.
    """
    with files.file_lock(path.with_suffix(".lock"), mode=CACHE_LOCK_MODE):
        if path.exists():
            try:
                saved = torch.load(path, map_location="cpu", weights_only=True)
                if not isinstance(saved, dict) or any(key not in saved for key in required):
                    raise ValueError(f"not a dict with keys {', '.join(required)}")
                load(saved)
                return saved
            except Exception as error:  # noqa: BLE001 — any failure to load means rebuild
                aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                os.replace(path, aside)
                log.warning(
                    "cache file %s failed to load (%s: %s); moved aside to %s and rebuilt",
                    path,
                    type(error).__name__,
                    " ".join(str(error).split())[:200],
                    aside,
                )
        saved = build()
        load(saved)
        files.write_atomic(path, lambda tmp: torch.save(saved, tmp), durable=True)
        return saved


class _StagedText:
    """The text task at `seq_len` for the first `steps` training batches, then at
    `long_seq_len`: one task, so `train` runs both stages with one optimizer and schedule.
    Eval batches are the first stage's."""

    def __init__(self, config: ReferenceConfig):
        self.short = _text_task(config, seq_len=config.seq_len, batch_size=config.batch_size)
        self.long = None
        if config.long_seq_len and config.long_steps:
            tokens = config.seq_len * config.batch_size
            self.long = _text_task(
                config,
                seq_len=config.long_seq_len,
                batch_size=max(1, tokens // config.long_seq_len),
            )
        self.steps = config.steps
        self.vocab_size = self.short.vocab_size
        self.has_accuracy = self.short.has_accuracy
        self.reports_bits_per_byte = self.short.reports_bits_per_byte

    def batch(self, split: str, index: int):
        if split == "train" and self.long is not None and index >= self.steps:
            return self.long.batch(split, index - self.steps)
        return self.short.batch(split, index)


def _train(config: ReferenceConfig) -> dict[str, Any]:
    started = time.perf_counter()
    log.info("training the reference model %s (once, then cached)", config)
    task = _StagedText(config)
    cpu = torch.device("cpu")
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = variants.TransformerLM(config.model_config())
        train(model, task, cpu, config.train_config())
        loss, _ = evaluate(model, task, cpu, n_batches=8)
    seconds = time.perf_counter() - started
    log.info("reference model trained in %.0f s", seconds)
    return {
        "state_dict": model.state_dict(),
        "config": dataclasses.asdict(config),
        "eval_bits_per_byte": loss / math.log(2),
        "train_seconds": seconds,
    }


def _text_task(config: ReferenceConfig, *, seq_len: int, batch_size: int):
    options = {"name": "text", "path": config.text_path}
    return build_task(options, seq_len=seq_len, batch_size=batch_size, seed=config.seed)


@torch.no_grad()
def attention_inputs(
    reference: ReferenceModel,
    *,
    seq_len: int,
    batch_size: int,
    index: int,
    device: torch.device,
    split: str = "eval",
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q, k, v that each layer's kernel receives on held-out text: one (q, k, v) per layer.

    Each tensor is (batch_size, n_heads, seq_len, head_dim), float32, on `device`; `index`
    picks the batch of `split` (eval: different windows of the held-out split). Positions are
    applied (rotary q and k are rotated), and under shared QK k is q, as the kernel gets them.
    """
    task = _text_task(reference.config, seq_len=seq_len, batch_size=batch_size)
    tokens = task.batch(split, index).inputs.to(device)  # (B, L)
    captured: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def keep(_module, args):
        captured.append(tuple(t.detach().float() for t in args))

    hooks = [kernel.register_forward_pre_hook(keep) for kernel in reference.model.kernels()]
    try:
        reference.model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def for_kernel(
    triple: tuple[torch.Tensor, torch.Tensor, torch.Tensor], kernel: Attention, *, shared_qk: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A captured (q, k, v) as a layer of a model with `shared_qk` hands it to `kernel`: k = q
    for a kernel that applies shared QK itself, the unit keys of q for another kernel under
    shared QK (`SelfAttention`), else as captured."""
    q, k, v = triple
    if kernel.applies_shared_qk:
        return q, q, v
    if shared_qk:
        return q, shared_qk_keys(q), v
    return q, k, v


# --- Fitting a kernel's learned state to the frozen reference ----------------------------------


def learns(kernel: Attention, sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> bool:
    """Whether `kernel` has learned state: trainable parameters, or buffers that one training
    forward on `sample` (q, k, v) changes (routing's centroids; not Performer's fixed draw).
    The check runs on a copy; `kernel` is untouched."""
    if any(p.requires_grad for p in kernel.parameters()):
        return True
    if not any(True for _ in kernel.buffers()):
        return False
    probe = copy.deepcopy(kernel).train()
    before = [b.clone() for b in probe.buffers()]
    with torch.no_grad():
        probe(*sample)
    return any(not torch.equal(a, b) for a, b in zip(before, probe.buffers(), strict=True))


# Steps between the fit's checks on held-out inputs (and one before the first step).
FIT_CHECK_EVERY = 20


def fit_kernel(
    kernel: Attention,
    exact: Attention,
    inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    steps: int,
    lr: float,
    held_out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
) -> int:
    """Fit `kernel` in place: `steps` steps minimising its mean relative squared output error
    ||kernel(q,k,v) - exact(q,k,v)||² / ||exact(q,k,v)||² over `inputs` (cycled, one triple
    per step), in training mode, so buffers a training forward updates (routing's centroids)
    follow the inputs too. Adam on its trainable parameters, if any. A gated kernel (NSA,
    DeltaNet) gets sigmoid(N(0, 1)) gates, the same ones for each triple every time it comes
    round.

    With `held_out` triples, the same error on them is checked before the first step, every
    FIT_CHECK_EVERY steps and after the last, and the kernel ends in the best checked state:
    a fit on a few sequences can over-fit them (compressed's convolution did, ending worse
    than it started), and a fit that ends worse than its start measures the fit, not the
    kernel. Returns the step count of the state kept (`steps` without `held_out`); the kernel
    ends in eval mode."""
    targets, gates = _fit_targets(kernel, exact, inputs, seed=0)
    checks = None
    if held_out:
        checks = (held_out, *_fit_targets(kernel, exact, held_out, seed=len(inputs)))
    parameters = [p for p in kernel.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=lr) if parameters else None
    best_step, best_error, best_state = steps, math.inf, None
    for step in range(steps + 1):
        if checks is not None and (step % FIT_CHECK_EVERY == 0 or step == steps):
            error = _fit_error(kernel, *checks)
            if error < best_error:
                best_step, best_error = step, error
                best_state = copy.deepcopy(kernel.state_dict())
        if step == steps:
            break
        kernel.train()
        index = step % len(inputs)
        (q, k, v), target = inputs[index], targets[index]
        if optimizer is None:
            with torch.no_grad():
                kernel(q, k, v, gates=gates[index])
            continue
        loss = _relative_squared_error(kernel(q, k, v, gates=gates[index]), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if best_state is not None:
        kernel.load_state_dict(best_state)
    kernel.eval()
    return best_step


def _fit_targets(kernel, exact, triples, *, seed: int):
    """Exact attention's outputs on `triples` and the gates `kernel` gets on each (seeded from
    `seed` on, one generator per triple)."""
    with torch.no_grad():
        targets = [exact(q, k, v) for q, k, v in triples]
    gates = [
        sample_gates(kernel, q, torch.Generator().manual_seed(seed + i))
        for i, (q, _, _) in enumerate(triples)
    ]
    return targets, gates


def _relative_squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).sum() / target.pow(2).sum()


@torch.no_grad()
def _fit_error(kernel, triples, targets, gates) -> float:
    """The fit's loss on `triples`, in eval mode (no buffer moves), averaged over them."""
    kernel.eval()
    errors = [
        float(_relative_squared_error(kernel(q, k, v, gates=g), target))
        for (q, k, v), target, g in zip(triples, targets, gates, strict=True)
    ]
    return sum(errors) / len(errors)


def fitted_kernel(
    reference: ReferenceModel,
    kernel_config: variants.ModelConfig,
    *,
    seq_len: int,
    device: torch.device,
    directory: Path,
    exact: Attention,
) -> tuple[Attention, int, int | None]:
    """A fresh kernel of `kernel_config`'s variant (seeded by the reference's seed), fitted to
    the reference if it has learned state (`fit_kernel`, its best state on a held-out
    training-split batch kept), the step count of that state (0: as initialised, or no learned
    state) and the length it was fitted at (`fit_length`; None without a fit). Fitted states
    are cached beside the reference, keyed by the kernel's config, that length and the fitting
    settings (`kernel_key`), so one fit serves every job length at or above `fit_max_len`."""
    config = reference.config
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        kernel = build_kernel(kernel_config).to(device)
    stateless = not any(True for _ in kernel.parameters()) and not any(
        True for _ in kernel.buffers()
    )
    if config.fit_steps == 0 or stateless:
        return kernel.eval(), 0, None
    length = fit_length(kernel_config.attention, seq_len, config)
    # The fit's training batches, then one more training-split batch held out to pick its
    # best state (the error itself is measured on the eval split).
    batches = [
        [
            for_kernel(triple, kernel, shared_qk=config.shared_qk)
            for triple in attention_inputs(
                reference, seq_len=length, batch_size=1, index=index, device=device, split="train"
            )
        ]
        for index in range(config.fit_batches + 1)
    ]
    inputs = [triple for batch in batches[:-1] for triple in batch]
    if not learns(kernel, inputs[0]):
        return kernel.eval(), 0, None
    key = kernel_key(kernel_config, length, config)
    path = reference.path.with_suffix("") / f"kernel-{key}.pt"
    # A cached state that did not fit (`_cached`) may have been loaded in part: a fit starts
    # from the state as initialised all the same.
    initial = {k: v.clone() for k, v in kernel.state_dict().items()}

    def build() -> dict[str, Any]:
        kernel.load_state_dict(initial)
        started = time.perf_counter()
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            kept = fit_kernel(
                kernel,
                exact,
                inputs,
                steps=config.fit_steps,
                lr=config.fit_lr,
                held_out=batches[-1],
            )
        log.info(
            "fitted %s to the reference in %.0f s (kept step %d of %d, best on held-out text)",
            kernel.name,
            time.perf_counter() - started,
            kept,
            config.fit_steps,
        )
        return {
            "state_dict": {k: v.cpu() for k, v in kernel.state_dict().items()},
            "kept_step": kept,
        }

    def fill(saved: dict[str, Any]) -> None:
        kernel.load_state_dict(saved["state_dict"])
        int(saved["kept_step"])

    saved = _cached(path, build, required=("state_dict", "kept_step"), load=fill)
    return kernel.eval(), int(saved["kept_step"]), length


def fit_length(attention: str, seq_len: int, config: ReferenceConfig) -> int:
    """The length a kernel is fitted at for a job of `seq_len`: the job's own when its learned
    state is per position (`bounded_length`, e.g. Linformer's projections over max_seq_len)
    or `fit_max_len` is 0, else at most `fit_max_len`. Block pooling weights, gate projections
    and cluster centroids fitted on 1024-token windows serve longer inputs as they are, and a
    fit at 4096 tokens cost most of a scaling job's time (NSA: 67 s of 86 s)."""
    if config.fit_max_len == 0 or variants.attention_spec(attention).bounded_length:
        return seq_len
    return min(seq_len, config.fit_max_len)


def kernel_key(kernel_config: variants.ModelConfig, seq_len: int, config: ReferenceConfig) -> str:
    """12 hex digits naming a fitted kernel: its variant and options, the model options it
    is built with, the length it is fitted at and the fitting settings."""
    model = kernel_config.model_options()
    # The length bound shapes learned state only where it is per position (Linformer); left in
    # the key elsewhere it gave each job length a fit of its own at the same `seq_len`.
    if not variants.attention_spec(kernel_config.attention).bounded_length:
        del model["max_seq_len"]
    blob = json.dumps(
        {
            "attention": kernel_config.attention,
            "options": dict(kernel_config.attention_options),
            "model": model,
            "seq_len": seq_len,
            "fit": {name: getattr(config, name) for name in _FIT_FIELDS},
            "recipe": FIT_VERSION,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --- The kernel swap ------------------------------------------------------------------------


@torch.no_grad()
def swap_bits_per_byte(
    reference: ReferenceModel,
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
    task = _text_task(reference.config, seq_len=seq_len, batch_size=batch_size)
    layers = [m for m in reference.model.modules() if isinstance(m, SelfAttention)]
    exact_loss = evaluate(reference.model, task, device, n_batches).loss
    with kernels_swapped(layers, [kernel] * len(layers)):
        swapped_loss = evaluate(reference.model, task, device, n_batches).loss
    return exact_loss / math.log(2), swapped_loss / math.log(2)
