"""The reference model: trained once per config and cached, its q, k, v, and the error on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import variants
from experiments import measure, reference_model
from experiments.reference_model import ReferenceConfig

CPU = torch.device("cpu")


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A small text file: the project's own sources, so training on it takes seconds."""
    sources = sorted(Path(measure.__file__).parent.glob("*.py"))
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"".join(p.read_bytes() for p in sources))
    return path


def _config(corpus: Path, **options) -> ReferenceConfig:
    tiny = {"depth": 2, "seq_len": 32, "batch_size": 4, "steps": 40, "lr": 3e-3}
    return ReferenceConfig(d_model=32, n_heads=2, text_path=str(corpus), **{**tiny, **options})


@pytest.fixture
def trainings(monkeypatch) -> list[ReferenceConfig]:
    """Every reference training, in order."""
    calls = []
    real = reference_model._train_and_save

    def counted(config, path):
        calls.append(config)
        real(config, path)

    monkeypatch.setattr(reference_model, "_train_and_save", counted)
    return calls


def test_the_model_is_trained_once_and_then_read_from_the_cache(corpus, tmp_path, trainings):
    config = _config(corpus)
    first = reference_model.load_or_train(config, CPU, tmp_path / "cache")
    second = reference_model.load_or_train(config, CPU, tmp_path / "cache")
    assert len(trainings) == 1
    assert first.path == second.path == tmp_path / "cache" / "reference" / f"{first.digest}.pt"
    assert first.path.exists() and first.eval_bits_per_byte == second.eval_bits_per_byte
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert first.eval_bits_per_byte < 8  # it learned something: uniform bytes are 8 bits


def test_a_changed_config_or_corpus_trains_a_new_model(corpus, tmp_path, trainings):
    cache = tmp_path / "cache"
    base = reference_model.load_or_train(_config(corpus), CPU, cache)
    longer = reference_model.load_or_train(_config(corpus, steps=41), CPU, cache)
    corpus.write_bytes(corpus.read_bytes() + b"# one more line\n")
    reference_model.read_corpus.cache_clear()
    grown = reference_model.load_or_train(_config(corpus), CPU, cache)
    assert len(trainings) == 3
    assert len({base.digest, longer.digest, grown.digest}) == 3


def test_the_default_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "a"))
    assert reference_model.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("ATTNBENCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert reference_model.cache_dir() == tmp_path / "xdg" / "attnbench"
    assert reference_model.cache_dir("~/elsewhere") == Path.home() / "elsewhere"


def test_attention_inputs_are_each_layers_qkv_at_any_length(corpus, tmp_path):
    reference = reference_model.load_or_train(_config(corpus), CPU, tmp_path)
    inputs = reference_model.attention_inputs(
        reference, seq_len=96, batch_size=3, index=0, device=CPU
    )
    assert len(inputs) == 2  # one per layer
    for q, k, v in inputs:
        assert q.shape == k.shape == v.shape == (3, 2, 96, 16)
    again = reference_model.attention_inputs(
        reference, seq_len=96, batch_size=3, index=0, device=CPU
    )
    other = reference_model.attention_inputs(
        reference, seq_len=96, batch_size=3, index=1, device=CPU
    )
    assert torch.equal(inputs[0][0], again[0][0]) and not torch.equal(inputs[0][0], other[0][0])


def test_error_on_trained_inputs_is_zero_for_exact_and_falls_as_the_window_grows(corpus, tmp_path):
    reference = reference_model.load_or_train(_config(corpus, steps=150), CPU, tmp_path)
    shape = (2, 2, 128, 16)

    def error(name, **options):
        kernel = variants.build_attention(name, causal=True, **options)
        inputs = measure.trained_inputs(reference, shape, CPU, seeds=2)
        return measure.approx_rel_error(kernel, inputs, CPU, torch.float32)

    assert error("full") < 1e-6
    errors = [error("blockwise", block_size=b) for b in (4, 8, 32)]
    assert 0 < errors[2] < errors[1] < errors[0] < 1, errors
    assert error("blockwise", block_size=64) < 1e-6  # two blocks of 64 hold every key: exact


def test_bad_reference_options_name_the_option(job_config):
    with pytest.raises(ValueError, match="'steps' must be a positive integer"):
        ReferenceConfig(d_model=32, n_heads=2, steps=0)
    with pytest.raises(ValueError, match="measure.reference.*step"):
        ReferenceConfig.of_job(job_config("+measure.reference.step=3"))
