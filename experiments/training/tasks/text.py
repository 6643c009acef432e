"""Byte-level language modelling over local text; by default the Python standard library's source.

The corpus is the bytes of one file, or of the files under a directory whose names match
`pattern`, read in sorted relative-path order and concatenated. With `path` unset it is the
installed Python's standard library `.py` files (site-packages excluded), so the task works on a
fresh machine without a download; it therefore depends on the Python version (31.5 MB in 1790
files for CPython 3.11.7).
The last `eval_fraction` of the bytes is the evaluation split, the rest the training split.

A batch is `batch_size` windows of seq_len + 1 bytes at offsets drawn from
`generator(seed, split, index)`; every position predicts the next byte. Bytes are tokens, so
the eval loss in nats per token divided by ln 2 is bits per byte (`reports_bits_per_byte`).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sysconfig
from pathlib import Path

import torch

from experiments.training.tasks import Batch, SeededTask, generator, register_task
from variants.checks import require_probability

OWNER = "task text"
VOCAB_SIZE = 256  # bytes
_EXCLUDED_DIRS = ("site-packages", "dist-packages")


def stdlib_dir() -> Path:
    """The installed Python's standard library directory (the base install's, even in a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path, pattern: str) -> list[Path]:
    """Regular files under `root` whose name matches `pattern` (fnmatch), sorted by relative
    path; third-party package directories (site-packages, dist-packages) are not entered."""
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _EXCLUDED_DIRS]
        for name in names:
            path = Path(directory, name)
            if fnmatch.fnmatch(name, pattern) and path.is_file():
                files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def read_corpus(path: str | None, pattern: str) -> torch.Tensor:
    """The corpus bytes as a (n_bytes,) uint8 tensor: a file, a directory's files, or the stdlib.

    Cached per process: tests and repeated builds read the files once.
    """
    root = stdlib_dir() if path is None else Path(path)
    if root.is_file():
        return _as_tensor(root.read_bytes())
    if not root.is_dir():
        raise ValueError(f"{OWNER}: option 'path'={path!r} is neither a file nor a directory")
    files = corpus_files(root, pattern)
    if not files:
        raise ValueError(
            f"{OWNER}: no file under {str(root)!r} matches option 'pattern'={pattern!r}"
        )
    return _as_tensor(b"".join(f.read_bytes() for f in files))


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ByteTask(SeededTask):
    """Next-byte prediction on random windows of a train and an eval byte sequence; bits per byte.

    A subclass checks its options, then hands its two splits to `use_splits`: (n,) uint8
    tensors, each longer than seq_len. batch(split, index) -> inputs and targets
    (batch_size, seq_len) int64, shifted by one byte, every position counted.
    """

    reports_bits_per_byte = True
    vocab_size = VOCAB_SIZE
    # Two splits only: periodic evaluations read the eval split (no learning rate is chosen on
    # a byte task here, so nothing is tuned on what is reported).
    validation_split = "eval"

    def use_splits(
        self, train: torch.Tensor, eval: torch.Tensor, valid: torch.Tensor | None = None
    ) -> None:
        """The splits; with `valid`, a third one held out from both, which the periodic
        evaluations then read (`validation_split`), so a learning rate can be chosen on it."""
        splits = {"train": train, "eval": eval, **({} if valid is None else {"valid": valid})}
        for split, data in splits.items():
            if len(data) <= self.seq_len:
                raise ValueError(
                    f"{self.owner}: the {split} split has {len(data)} bytes, fewer than "
                    f"option 'seq_len' + 1 = {self.seq_len + 1}"
                )
        self.splits = splits
        if valid is not None:
            self.validation_split = "valid"

    def batch(self, split: str, index: int) -> Batch:
        data = self.splits[split]
        g = generator(self.seed, split, index)
        starts = torch.randint(len(data) - self.seq_len, (self.batch_size, 1), generator=g)
        offsets = starts + torch.arange(self.seq_len + 1)  # (B, L + 1)
        window = data[offsets].long()  # (B, L + 1)
        inputs, targets = window[:, :-1], window[:, 1:]  # (B, L) each
        return Batch(inputs, targets, torch.ones_like(targets, dtype=torch.bool))


@register_task
class Text(ByteTask):
    """Next-byte prediction over local text (default: the stdlib's .py files); bits per byte."""

    name = "text"

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        path: str | None = None,
        pattern: str = "*.py",
        eval_fraction: float = 0.05,
        valid_fraction: float = 0.0,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        if isinstance(eval_fraction, bool) or not 0 < eval_fraction < 1:
            raise ValueError(
                f"{OWNER}: option 'eval_fraction' must be in (0, 1), got {eval_fraction!r}"
            )
        valid_fraction = require_probability(OWNER, "valid_fraction", valid_fraction)
        if eval_fraction + valid_fraction >= 1:
            raise ValueError(
                f"{OWNER}: options 'eval_fraction' + 'valid_fraction' must be below 1, got "
                f"{eval_fraction} + {valid_fraction}"
            )
        corpus = read_corpus(path, pattern)  # (n,) uint8
        n_train = int(len(corpus) * (1 - eval_fraction))
        if not valid_fraction:
            self.use_splits(corpus[:n_train], corpus[n_train:])
            return
        # The validation bytes come just before the eval split, so eval is the same bytes
        # with or without them; training loses them.
        n_fit = n_train - int(len(corpus) * valid_fraction)
        self.use_splits(corpus[:n_fit], corpus[n_train:], valid=corpus[n_fit:n_train])
