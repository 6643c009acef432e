"""enwik8: byte-level language modelling on the first 10^8 bytes of an English Wikipedia dump.

The standard split: the first 90M bytes train, the next 5M validate, the last 5M test. `path` is
the Hutter Prize archive `enwik8.zip` (one member, `enwik8`) or the raw file;
`python -m experiments.training.tasks.download_enwik8` fetches the archive. Evaluation uses the
validation bytes (`eval_split=valid`) or the test bytes (`eval_split=test`). The split sizes are
options so that a small file of the same format can stand in for the real one in tests.

Batches are random windows as in the `text` task; the metric is bits per byte.
"""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path

import torch

from experiments.training.tasks import register_task
from experiments.training.tasks.text import ByteTask
from variants.checks import require_choice, require_positive_int

OWNER = "task enwik8"
MEMBER = "enwik8"  # the archive's single member


@functools.lru_cache(maxsize=2)
def read_enwik8(path: str) -> torch.Tensor:
    """The bytes of `path` (a zip holding `enwik8`, or the raw file) as a (n,) uint8 tensor."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(
            f"{OWNER}: option 'path'={path!r} is not a file; run "
            f"`python -m experiments.training.tasks.download_enwik8` or point task.path at "
            "enwik8(.zip)"
        )
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as archive:
            if MEMBER not in archive.namelist():
                raise ValueError(f"{OWNER}: archive {path!r} has no member {MEMBER!r}")
            data = archive.read(MEMBER)
    else:
        data = file.read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def split_enwik8(data: torch.Tensor, train_bytes: int, valid_bytes: int) -> dict[str, torch.Tensor]:
    """{"train", "valid", "test"} views of `data`: the first train_bytes, the next valid_bytes,
    then the rest, which the standard split makes as long as valid."""
    if len(data) < train_bytes + valid_bytes:
        raise ValueError(
            f"{OWNER}: the file has {len(data)} bytes, fewer than 'train_bytes' + "
            f"'valid_bytes' = {train_bytes + valid_bytes}"
        )
    return {
        "train": data[:train_bytes],
        "valid": data[train_bytes : train_bytes + valid_bytes],
        "test": data[train_bytes + valid_bytes :],
    }


@register_task
class Enwik8(ByteTask):
    """Next-byte prediction on enwik8 with the 90M/5M/5M split; bits per byte."""

    name = "enwik8"

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        path: str = "data/enwik8.zip",
        train_bytes: int = 90_000_000,
        valid_bytes: int = 5_000_000,
        eval_split: str = "valid",
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        require_positive_int(OWNER, "train_bytes", train_bytes)
        require_positive_int(OWNER, "valid_bytes", valid_bytes)
        require_choice(OWNER, "eval_split", eval_split, ("valid", "test"))
        splits = split_enwik8(read_enwik8(str(path)), train_bytes, valid_bytes)
        self.use_splits(splits["train"], splits[eval_split])
