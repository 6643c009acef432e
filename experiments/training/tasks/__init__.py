"""Tasks a model trains on: seeded batch generators selected by `task.name`.

A task yields `Batch`es of token ids for next-token prediction; `loss_mask` says which target
positions count (e.g. only the second copy in the duplication task). Batches are a pure function
of (seed, split, index), so every variant sees exactly the same data.

Splits: `train`, `eval` (what is reported) and, for the generated tasks, `valid`: batches held
out from both, which training's periodic evaluations, early stopping and the choice of a
learning rate read, so that nothing is tuned on the numbers reported. A task's
`validation_split` names it (`eval` for the text tasks, whose corpus has two splits).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from variants.checks import require_positive_int
from variants.registry_base import Registry


@dataclass
class Batch:
    """inputs, targets: (B, L) int64; loss_mask: (B, L) bool, True where the target counts."""

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(
            *(t.to(device, non_blocking=True) for t in (self.inputs, self.targets, self.loss_mask))
        )


class Task(Protocol):
    """A task: its token vocabulary, whether it scores accuracy, and whether its eval loss over
    ln 2 is bits per byte (byte-level tasks)."""

    name: str
    vocab_size: int
    has_accuracy: bool
    reports_bits_per_byte: bool
    validation_split: str

    def batch(self, split: str, index: int) -> Batch:
        """Batch number `index` of `split` ("train", "eval" or the task's `validation_split`),
        identical on every call."""
        ...


# Every task class by name; importing the built-in task modules registers them.
_BUILTIN = (
    "duplication",
    "enwik8",
    "listops",
    "long_recall",
    "mad",
    "random_lm",
    "recall",
    "text",
)
_TASKS: Registry[type] = Registry(
    "task", builtins=[f"experiments.training.tasks.{m}" for m in _BUILTIN]
)


def register_task(cls: type) -> type:
    """Class decorator: add a task class to the registry under `cls.name`."""
    _TASKS.add(cls.name, cls)
    return cls


def task_names() -> list[str]:
    """Names of all registered tasks, in registration order."""
    return _TASKS.names()


def task_class(name: str) -> type:
    """The task class registered as `name`; `ValueError` listing the tasks if unknown."""
    return _TASKS[name]


def build_task(options: dict[str, Any], *, seq_len: int, batch_size: int, seed: int) -> Task:
    """Build the task `options["name"]` with its other options; ValueError naming bad ones."""
    options = dict(options)
    name = options.pop("name")
    task_cls = task_class(name)
    try:
        return task_cls(seq_len=seq_len, batch_size=batch_size, seed=seed, **options)
    except TypeError as error:  # an option the task does not take
        raise ValueError(f"task {name!r}: {error}") from None


class SeededTask:
    """What the built-in tasks share: `seq_len`, `batch_size` and `seed`, checked, and the
    `Task` defaults (no accuracy, a loss that is not bits per byte)."""

    name: ClassVar[str]
    has_accuracy: ClassVar[bool] = False
    reports_bits_per_byte: ClassVar[bool] = False
    validation_split: ClassVar[str] = "valid"

    def __init__(self, *, seq_len: int, batch_size: int, seed: int):
        self.seq_len = require_positive_int(self.owner, "seq_len", seq_len)
        self.batch_size = require_positive_int(self.owner, "batch_size", batch_size)
        self.seed = seed

    @property
    def owner(self) -> str:
        """How error messages name the task: `task <name>`."""
        return f"task {self.name}"


def place(
    length: int,
    batch: int,
    *parts: tuple[torch.Tensor, torch.Tensor | int | bool],
    fill: int | bool,
) -> torch.Tensor:
    """(B, length) tensor of `fill` with each part's values written at its positions: how the
    tasks lay out their pairs (a key and its value, a query and its answer, a copy of a word)
    and mark the positions that are scored.

    A part is (positions, values): positions (n,) the same in every row or (B, n) per row, each
    in [0, length); values (B, n) or one value for every position. The dtype is `fill`'s: an int
    gives int64 token ids, a bool a mask. Parts are written in order, so a later one wins where
    positions coincide.
    """
    out = torch.full((batch, length), fill)  # (B, length)
    rows = torch.arange(batch)[:, None]  # (B, 1)
    for positions, values in parts:
        out[rows, positions] = values
    return out


SPLITS = ("train", "eval", "valid")


def generator(seed: int, split: str, index: int) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, split, index).

    The seed is a digest of the three, so it is the same in every process and Python version
    (unlike `hash`), and neighbouring indices give unrelated streams.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    digest = hashlib.sha256(f"{seed}/{split}/{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
