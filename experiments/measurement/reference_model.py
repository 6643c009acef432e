"""The reference model whose attention inputs the approximation error is measured on
(experiments/measurement/approximation.py): a small language model trained on the `text` task
(the stdlib corpus unless `text_path` says otherwise), its config (`ReferenceConfig`), its
training, its on-disk cache (`load_or_train`) and the q, k, v each of its layers' kernels
receives on held-out text (`attention_inputs`, `for_kernel`).

The reference uses rotary positions and, after its stage at `seq_len`, trains a short stage at
`long_seq_len`, so its `trained_length` covers the lengths the main job reports (a job longer
than that gets no error). A shared-QK kernel is measured on a reference trained with shared QK.
Models and fitted kernels are cached under `$ATTNBENCH_CACHE_DIR` (else
`$XDG_CACHE_HOME/attnbench`, else `~/.cache/attnbench`), keyed by a digest of every setting that
shapes them; concurrent jobs wait on a file lock, and a cached file that fails to load is moved
aside and rebuilt.

The cache's layout, keys, locking and writes: docs/internals.md, "reference_model".
"""

from __future__ import annotations

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
from experiments.job_config import JobConfig
from experiments.records import files
from experiments.training.tasks import build_task
from experiments.training.tasks.text import read_corpus
from experiments.training.train import evaluate, train
from experiments.training.train_config import TrainConfig
from variants.attention.common.base import Attention, shared_qk_keys
from variants.checks import require_choice, require_non_negative_int, require_positive_int
from variants.model_config import POSITIONS

log = logging.getLogger("attnbench")

CACHE_LOCK_MODE = 0o600  # the cache's lock files: private to the user (less the umask)

# Bump when the training recipe below changes what a cached model is.
RECIPE_VERSION = 2
# ReferenceConfig fields that shape the fitted kernels only, not the model (not in its digest).
_FIT_FIELDS = ("fit_steps", "fit_lr", "fit_batches", "fit_max_len")


@dataclass(frozen=True)
class ReferenceConfig:
    """How the reference model is built and trained, and how kernels are fitted to it.

    d_model, n_heads and n_kv_heads follow the job, so its q has the shape (batch, n_heads,
    seq_len, d_model / n_heads) the job's kernel takes and its k, v have `kv_heads` heads
    (grouped KV heads: the kernel is measured on grouped k, v as a GQA model gives them);
    `shared_qk` follows the job's resolved model option. Training: `steps` steps of
    `batch_size` sequences of `seq_len` tokens, then `long_steps` steps at `long_seq_len` (0:
    none) with as many tokens per step (at least one sequence), one AdamW and one
    warm-up/cosine schedule over both. `positions`: as `model.positions`. Fitting
    (`kernel_fit.fit_kernel`): `fit_steps` Adam steps at `fit_lr` cycling over `fit_batches`
    training-split batches of at most `fit_max_len` tokens (0: the job's length) for kernels
    whose learned state does not depend on the length (all but `bounded_length` ones such as
    Linformer, fitted at the job's length).
    """

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None  # None: n_heads (plain multi-head; n_heads is read as None)
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
        if self.n_kv_heads == self.n_heads:
            # One config (and one digest, one cached model) for plain multi-head, however said.
            object.__setattr__(self, "n_kv_heads", None)

    @classmethod
    def of_job(cls, job: JobConfig) -> ReferenceConfig:
        """The reference config of a job: its `measure.reference` options, model width and
        resolved shared QK."""
        options = {k: v for k, v in job.measure.reference.items() if k != "cache_dir"}
        try:
            return cls(
                d_model=job.model["d_model"],
                n_heads=job.model["n_heads"],
                n_kv_heads=job.model.get("n_kv_heads"),
                shared_qk=job.shared_qk,
                **options,
            )
        except TypeError as error:
            raise ValueError(f"config: measure.reference: {error}") from None

    @property
    def kv_heads(self) -> int:
        """Heads of the reference's keys and values: `n_kv_heads`, or n_heads when None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

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
            n_kv_heads=self.n_kv_heads,
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
        if self.n_kv_heads is None:
            # Left out without grouped heads: the digests (and caches) of before still hold.
            del shaping["n_kv_heads"]
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

    q is (batch_size, n_heads, seq_len, head_dim), k and v (batch_size, kv_heads, seq_len,
    head_dim) (`ReferenceConfig.kv_heads`: grouped KV heads), float32, on `device`; `index`
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
