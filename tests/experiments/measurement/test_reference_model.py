"""The reference model: trained once per config and cached, and its q, k, v."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import variants
from experiments.measurement import kernel_fit, reference_model
from experiments.measurement.reference_model import ReferenceConfig
from tests.experiments.measurement.conftest import reference_config

CPU = torch.device("cpu")


@pytest.fixture
def trainings(monkeypatch) -> list[ReferenceConfig]:
    """Every reference training, in order."""
    calls = []
    real = reference_model._train

    def counted(config):
        calls.append(config)
        return real(config)

    monkeypatch.setattr(reference_model, "_train", counted)
    return calls


def test_the_model_is_trained_once_and_then_read_from_the_cache(corpus, tmp_path, trainings):
    config = reference_config(corpus)
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
    base = reference_model.load_or_train(reference_config(corpus), CPU, cache)
    longer = reference_model.load_or_train(reference_config(corpus, steps=41), CPU, cache)
    corpus.write_bytes(corpus.read_bytes() + b"# one more line\n")
    reference_model.read_corpus.cache_clear()
    grown = reference_model.load_or_train(reference_config(corpus), CPU, cache)
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
    reference = reference_model.load_or_train(reference_config(corpus), CPU, tmp_path)
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


def test_bad_reference_options_name_the_option(job_config):
    with pytest.raises(ValueError, match="'steps' must be a positive integer"):
        ReferenceConfig(d_model=32, n_heads=2, steps=0)
    with pytest.raises(ValueError, match="measure.reference.*step"):
        ReferenceConfig.of_job(job_config("+measure.reference.step=3"))


def test_the_reference_trains_a_long_stage_with_one_optimizer(corpus, tmp_path, monkeypatch):
    config = reference_config(corpus, steps=6, long_seq_len=96, long_steps=3)
    assert config.trained_length == 96 and config.train_config().steps == 9
    lengths, optimizers = [], []
    real_train = reference_model.train

    def spy(model, task, device, settings, **kwargs):
        optimizers.append(settings.steps)
        lengths.extend(task.batch("train", step).inputs.shape[1] for step in range(settings.steps))
        return real_train(model, task, device, settings, **kwargs)

    monkeypatch.setattr(reference_model, "train", spy)
    reference_model.load_or_train(config, CPU, tmp_path)
    assert optimizers == [9]  # one train() call: one AdamW, one schedule over both stages
    assert lengths == [32] * 6 + [96] * 3
    assert reference_config(corpus, long_steps=0).trained_length == 32


def test_a_damaged_cache_file_is_moved_aside_and_rebuilt(corpus, tmp_path, trainings, caplog):
    config = reference_config(corpus)
    first = reference_model.load_or_train(config, CPU, tmp_path)
    first.path.write_bytes(first.path.read_bytes()[:100])  # cut short, as a crash could leave it
    with caplog.at_level("WARNING", logger="attnbench"):
        second = reference_model.load_or_train(config, CPU, tmp_path)
    assert len(trainings) == 2  # rebuilt
    aside = list(first.path.parent.glob(f"{first.path.name}.damaged-*"))
    assert len(aside) == 1 and aside[0].stat().st_size == 100
    assert str(first.path) in caplog.text and str(aside[0]) in caplog.text
    assert second.eval_bits_per_byte == pytest.approx(first.eval_bits_per_byte)
    torch.save(["not", "a", "dict"], first.path)  # loads, but is not a reference
    reference_model.load_or_train(config, CPU, tmp_path)
    assert len(trainings) == 3


def test_a_cache_file_of_tensors_that_do_not_fit_is_moved_aside_and_rebuilt(
    corpus, tmp_path, trainings, caplog
):
    """A file that loads but holds another model's tensors (missing keys, other shapes) is
    damaged as a truncated one is: named, moved aside, rebuilt; so is a fitted kernel's."""
    config = reference_config(corpus, fit_steps=3)
    first = reference_model.load_or_train(config, CPU, tmp_path)
    other = variants.TransformerLM(dataclasses.replace(config, depth=1).model_config())
    torch.save({"state_dict": other.state_dict(), "eval_bits_per_byte": 1.0}, first.path)
    with caplog.at_level("WARNING", logger="attnbench"):
        second = reference_model.load_or_train(config, CPU, tmp_path)
    assert len(trainings) == 2  # rebuilt
    aside = list(first.path.parent.glob(f"{first.path.name}.damaged-*"))
    assert len(aside) == 1 and str(first.path) in caplog.text and str(aside[0]) in caplog.text
    assert "Missing key" in caplog.text
    assert second.eval_bits_per_byte == pytest.approx(first.eval_bits_per_byte)
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)

    kernel_config = variants.ModelConfig(
        d_model=32, n_heads=2, max_seq_len=64, attention="compressed", causal=True
    )
    exact = variants.build_attention("full", causal=True)

    def fitted():
        return kernel_fit.fitted_kernel(
            second, kernel_config, seq_len=64, device=CPU, directory=tmp_path, exact=exact
        )

    kernel, _, _ = fitted()
    (path,) = (tmp_path / "reference" / second.digest).glob("kernel-*.pt")
    # The keys, the first tensor of its shape (so it loads), the others of other shapes.
    state = {name: torch.zeros(3) for name in kernel.state_dict()}
    name, value = next(iter(kernel.state_dict().items()))
    state[name] = torch.zeros_like(value)
    torch.save({"state_dict": state, "kept_step": 1}, path)
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnbench"):
        again, _, _ = fitted()
    assert len(list(path.parent.glob(f"{path.name}.damaged-*"))) == 1
    assert str(path) in caplog.text and "size mismatch" in caplog.text
    for a, b in zip(kernel.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)  # fitted again from the state as initialised


def _cache(path):
    """The reference cache's `_cached` on a one-tensor dict (built, saved, loaded as is)."""
    return reference_model._cached(path, lambda: {"x": torch.ones(3)}, ("x",), lambda saved: None)


def test_the_cache_file_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = reference_model.os.fsync, reference_model.os.replace
    monkeypatch.setattr(
        reference_model.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        reference_model.os,
        "replace",
        lambda a, b: (events.append(("replace", Path(b).name)), real_replace(a, b))[1],
    )
    _cache(tmp_path / "m.pt")
    assert events == ["fsync", ("replace", "m.pt"), "fsync"]  # the file, then its directory
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["x"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.lock", "m.pt"]  # nothing beside


def test_the_lock_file_does_not_follow_symlinks(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    lock = tmp_path / "reference" / "abc.lock"
    lock.parent.mkdir()
    lock.symlink_to(precious)
    with pytest.raises(OSError):
        _cache(tmp_path / "reference" / "abc.pt")
    assert precious.read_text() == "keep me"
    assert not (tmp_path / "reference" / "abc.pt").exists()
    _cache(tmp_path / "reference" / "new.pt")
    assert (tmp_path / "reference" / "new.lock").stat().st_mode & 0o777 == 0o600
