"""The reference model whose attention inputs approximation error is measured on.

Exact attention over q, k, v drawn from N(0, 1) is nearly uniform at realistic head sizes, so
every approximation looks broken on such inputs (relative errors above 1). What a user cares
about is the error on the queries, keys and values a trained model produces. So a job measures
`approx_rel_error` on the q, k, v of a small language model trained on the `text` task (the
stdlib corpus unless `text_path` says otherwise), run on held-out text at the job's length.

The model is trained once per configuration, seeded, and cached under the user's cache
directory (`$ATTNBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/attnbench`, else
`~/.cache/attnbench`) as `reference/<digest>.pt`. The digest covers every setting that shapes
it (`ReferenceConfig` and the corpus's size), so a changed config trains a new one; concurrent
jobs wait on a file lock instead of training it twice.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

import variants
from experiments.config import JobConfig, TrainConfig
from experiments.tasks import build_task
from experiments.tasks.text import read_corpus
from experiments.train import evaluate, train
from variants.checks import require_positive_int

log = logging.getLogger("attnbench")

# Bump when the training recipe below changes what a cached model is.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class ReferenceConfig:
    """How the reference model is built and trained. d_model and n_heads follow the job, so its
    q, k, v have the shape (batch, n_heads, seq_len, d_model / n_heads) the job's kernel takes."""

    d_model: int
    n_heads: int
    depth: int = 2
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 300
    lr: float = 2e-3
    seed: int = 0
    text_path: str | None = None

    def __post_init__(self):
        for name in ("d_model", "n_heads", "depth", "seq_len", "batch_size", "steps"):
            require_positive_int("measure.reference", name, getattr(self, name))

    @classmethod
    def of_job(cls, job: JobConfig) -> ReferenceConfig:
        """The reference config of a job: its `measure.reference` options and model width."""
        options = {k: v for k, v in job.measure.reference.items() if k != "cache_dir"}
        try:
            return cls(d_model=job.model["d_model"], n_heads=job.model["n_heads"], **options)
        except TypeError as error:
            raise ValueError(f"config: measure.reference: {error}") from None

    def model_config(self) -> variants.ModelConfig:
        """The reference model: full attention, causal, at this width and depth. The job's
        kernel may run at any length; sinusoids extend, so the length bound is only a guard."""
        return variants.ModelConfig(
            vocab_size=256,
            d_model=self.d_model,
            n_heads=self.n_heads,
            depth=self.depth,
            max_seq_len=2**24,
            attention="full",
            causal=True,
        )

    def train_config(self) -> TrainConfig:
        """How it is trained (the recipe of RECIPE_VERSION)."""
        return TrainConfig(
            steps=self.steps,
            lr=self.lr,
            warmup=min(100, self.steps // 10),
            weight_decay=0.01,
            grad_clip=1.0,
            eval_every=0,
            eval_batches=8,
        )

    def digest(self) -> str:
        """12 hex digits naming the model: the config, the corpus size and the recipe."""
        corpus_bytes = len(read_corpus(self.text_path, "*.py"))
        blob = json.dumps(
            {**dataclasses.asdict(self), "corpus_bytes": corpus_bytes, "recipe": RECIPE_VERSION},
            sort_keys=True,
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
    """The cached reference model of `config`, trained (and cached) first if there is none."""
    digest = config.digest()
    directory = cache_dir() if directory is None else directory
    path = directory / "reference" / f"{digest}.pt"
    with _locked(path.with_suffix(".lock")):
        if not path.exists():
            _train_and_save(config, path)
        saved = torch.load(path, map_location="cpu", weights_only=True)
    model = variants.TransformerLM(config.model_config())
    model.load_state_dict(saved["state_dict"])
    model.to(device).eval()
    return ReferenceModel(model, config, digest, saved["eval_bits_per_byte"], path)


def _train_and_save(config: ReferenceConfig, path: Path) -> None:
    started = time.perf_counter()
    log.info("training the reference model %s (once; cached in %s)", config, path.parent)
    task = _text_task(config, seq_len=config.seq_len, batch_size=config.batch_size)
    cpu = torch.device("cpu")
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = variants.TransformerLM(config.model_config())
        train(model, task, cpu, config.train_config())
        loss, _ = evaluate(model, task, cpu, n_batches=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(
        {
            "state_dict": model.state_dict(),
            "config": dataclasses.asdict(config),
            "eval_bits_per_byte": loss / math.log(2),
            "train_seconds": time.perf_counter() - started,
        },
        partial,
    )
    os.replace(partial, path)
    log.info("reference model trained in %.0f s", time.perf_counter() - started)


def _text_task(config: ReferenceConfig, *, seq_len: int, batch_size: int):
    options = {"name": "text", "path": config.text_path}
    return build_task(options, seq_len=seq_len, batch_size=batch_size, seed=config.seed)


@torch.no_grad()
def attention_inputs(
    reference: ReferenceModel, *, seq_len: int, batch_size: int, index: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """q, k, v that each layer's kernel receives on held-out text: one (q, k, v) per layer.

    Each tensor is (batch_size, n_heads, seq_len, head_dim), float32, on `device`; `index`
    picks the eval batch (different windows of the held-out split).
    """
    task = _text_task(reference.config, seq_len=seq_len, batch_size=batch_size)
    tokens = task.batch("eval", index).inputs.to(device)  # (B, L)
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


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing), so one process trains at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
