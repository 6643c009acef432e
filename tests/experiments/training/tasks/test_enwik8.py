"""enwik8: reading the zip or the raw file and the 90/5/5 split, on a small generated archive."""

from __future__ import annotations

import zipfile

import pytest
import torch

from experiments.training.tasks import build_task
from experiments.training.tasks.download_enwik8 import is_valid_archive
from experiments.training.tasks.enwik8 import read_enwik8, split_enwik8

# A stand-in for enwik8 at 1/10^6 scale: 90 train, 5 valid, 5 test bytes, each split one letter.
DATA = b"t" * 90 + b"v" * 5 + b"s" * 5


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("enwik8", DATA)
    return path


def _task(path, eval_split="valid", seq_len=4):
    options = {
        "name": "enwik8",
        "path": str(path),
        "train_bytes": 90,
        "valid_bytes": 5,
        "eval_split": eval_split,
    }
    return build_task(options, seq_len=seq_len, batch_size=8, seed=0)


def test_zip_and_raw_file_read_the_same_bytes(archive, tmp_path):
    raw = tmp_path / "enwik8"
    raw.write_bytes(DATA)
    assert bytes(read_enwik8(str(archive))) == bytes(read_enwik8(str(raw))) == DATA


def test_split_is_train_then_valid_then_test(archive):
    splits = split_enwik8(read_enwik8(str(archive)), 90, 5)
    assert {k: len(v) for k, v in splits.items()} == {"train": 90, "valid": 5, "test": 5}
    assert bytes(splits["train"]) == b"t" * 90
    assert bytes(splits["valid"]) == b"v" * 5 and bytes(splits["test"]) == b"s" * 5


@pytest.mark.parametrize("eval_split, letter", [("valid", "v"), ("test", "s")])
def test_batches_come_from_their_split(archive, eval_split, letter):
    task = _task(archive, eval_split)
    assert (task.batch("train", 0).inputs == ord("t")).all()
    assert (task.batch("eval", 0).inputs == ord(letter)).all()
    assert task.vocab_size == 256 and task.reports_bits_per_byte
    again = _task(archive, eval_split)
    assert torch.equal(task.batch("train", 3).inputs, again.batch("train", 3).inputs)


def test_the_default_sizes_are_the_standard_split():
    splits = split_enwik8(torch.zeros(100_000_000, dtype=torch.uint8), 90_000_000, 5_000_000)
    assert [len(v) for v in splits.values()] == [90_000_000, 5_000_000, 5_000_000]


def test_errors_name_the_option(archive, tmp_path):
    with pytest.raises(ValueError, match="'path'"):
        _task(tmp_path / "missing.zip")
    with pytest.raises(ValueError, match="fewer than option 'seq_len'"):
        _task(archive, seq_len=5)  # the 5-byte eval split cannot hold 6-byte windows
    with pytest.raises(ValueError, match="'eval_split'"):
        _task(archive, eval_split="dev")


def test_a_small_archive_is_not_a_valid_download(archive):
    assert not is_valid_archive(archive)
