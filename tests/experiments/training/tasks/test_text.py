"""Byte-level text LM: corpus building (a file, a directory, the stdlib default), split, batches."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.training.tasks import build_task
from experiments.training.tasks.text import corpus_files, read_corpus, stdlib_dir


def _task(path, seq_len=8, batch_size=2, seed=0, **options):
    options = {"eval_fraction": 0.25, **options}
    return build_task(
        {"name": "text", "path": path, **options}, seq_len=seq_len, batch_size=batch_size, seed=seed
    )


@pytest.fixture
def tree(tmp_path):
    """A small source tree, with a site-packages dir that must be skipped."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "site-packages" / "thirdparty").mkdir(parents=True)
    (tmp_path / "b.py").write_bytes(b"B" * 40)
    (tmp_path / "a.py").write_bytes(b"A" * 40)
    (tmp_path / "pkg" / "c.py").write_bytes(b"C" * 40)
    (tmp_path / "notes.txt").write_bytes(b"T" * 40)
    (tmp_path / "site-packages" / "thirdparty" / "x.py").write_bytes(b"X" * 40)
    return tmp_path


def test_directory_corpus_is_sorted_matching_files_without_site_packages(tree):
    names = [p.relative_to(tree).as_posix() for p in corpus_files(tree, "*.py")]
    assert names == ["a.py", "b.py", "pkg/c.py"]
    corpus = read_corpus(str(tree), "*.py")
    assert corpus.dtype == torch.uint8 and bytes(corpus) == b"A" * 40 + b"B" * 40 + b"C" * 40


def test_the_last_eval_fraction_is_the_eval_split(tree):
    # 120 bytes, eval = the last 30: windows of 9 bytes from the eval split are all "C".
    task = _task(str(tree), eval_fraction=0.25, batch_size=16)
    eval_batch = task.batch("eval", 0)
    assert (eval_batch.inputs == ord("C")).all()
    train = torch.cat([task.batch("train", i).inputs for i in range(8)])
    assert (train == ord("A")).any() and (train == ord("B")).any()
    assert task.vocab_size == 256 and task.reports_bits_per_byte


def test_a_single_file_is_a_corpus(tmp_path):
    file = tmp_path / "book.txt"
    file.write_bytes(bytes(range(256)) * 2)
    batch = _task(str(file), seq_len=16, batch_size=3).batch("train", 0)
    assert batch.inputs.shape == batch.targets.shape == (3, 16)
    assert batch.loss_mask.all()
    # consecutive bytes of the file: every target is the next byte value
    assert torch.equal(batch.targets, (batch.inputs + 1) % 256)


def test_default_corpus_is_the_stdlib_sources():
    corpus = read_corpus(None, "*.py")
    files = corpus_files(stdlib_dir(), "*.py")
    assert files and all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    assert len(corpus) == sum(f.stat().st_size for f in files)
    first = files[0].read_bytes()
    assert bytes(corpus[: len(first)]) == first
    assert any(f.relative_to(stdlib_dir()).as_posix() == "json/decoder.py" for f in files)


def test_batches_are_deterministic_and_differ_by_index(tree):
    a, b = _task(str(tree), seed=4), _task(str(tree), seed=4)
    assert torch.equal(a.batch("train", 2).inputs, b.batch("train", 2).inputs)
    starts = {int(a.batch("train", i).inputs[0].float().sum()) for i in range(20)}
    assert len(starts) > 1


def test_uniform_prediction_costs_eight_bits_per_byte(tree):
    from experiments.training.train import masked_loss_and_hits

    batch = _task(str(tree)).batch("train", 0)
    loss, _ = masked_loss_and_hits(torch.zeros(2, 8, 256), batch)
    assert loss.item() / math.log(2) == pytest.approx(8.0)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"eval_fraction": 1.0}, "'eval_fraction'"),
        ({"pattern": "*.rs"}, "'pattern'"),
        ({"seq_len": 200}, "fewer than option 'seq_len'"),
    ],
)
def test_bad_options_are_value_errors_naming_them(tree, options, match):
    with pytest.raises(ValueError, match=match):
        _task(str(tree), **options)


def test_missing_path_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="'path'"):
        _task(str(tmp_path / "nope"))


def test_a_valid_fraction_is_held_out_before_the_eval_split_which_stays_the_same(tree):
    # 120 bytes: eval the last 30, valid the 30 before them (bytes 60-90), train the first 60.
    plain = _task(str(tree), eval_fraction=0.25, batch_size=16)
    held = _task(str(tree), eval_fraction=0.25, valid_fraction=0.25, batch_size=16)
    assert plain.validation_split == "eval" and held.validation_split == "valid"
    assert torch.equal(held.splits["eval"], plain.splits["eval"])
    corpus = read_corpus(str(tree), "*.py")
    assert torch.equal(held.splits["valid"], corpus[60:90])
    assert torch.equal(held.splits["train"], corpus[:60])
    assert held.batch("valid", 0).inputs.shape == (16, 8)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"valid_fraction": -0.1}, r"'valid_fraction' must be in \[0, 1\)"),
        ({"valid_fraction": 0.8}, "'eval_fraction' \\+ 'valid_fraction' must be below 1"),
    ],
)
def test_a_bad_valid_fraction_is_named(tree, options, match):
    with pytest.raises(ValueError, match=match):
        _task(str(tree), **options)
