"""The reference model: trained once per config and cached, its q, k, v, and the error on them."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

import variants
import variants.layers
from experiments.measurement import measure, reference_model
from experiments.measurement.reference_model import ReferenceConfig

CPU = torch.device("cpu")


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A small text file: the project's own sources, so training on it takes seconds."""
    sources = sorted(Path(measure.__file__).parents[1].glob("**/*.py"))  # experiments/
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"".join(p.read_bytes() for p in sources))
    return path


def _config(corpus: Path, **options) -> ReferenceConfig:
    tiny = {
        "depth": 2,
        "seq_len": 32,
        "batch_size": 4,
        "steps": 40,
        "long_seq_len": 128,
        "long_steps": 4,
        "lr": 3e-3,
        "fit_steps": 60,
    }
    return ReferenceConfig(d_model=32, n_heads=2, text_path=str(corpus), **{**tiny, **options})


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
    reference = reference_model.load_or_train(
        _config(corpus, steps=150, long_steps=0), CPU, tmp_path
    )
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


def test_the_reference_trains_a_long_stage_with_one_optimizer(corpus, tmp_path, monkeypatch):
    config = _config(corpus, steps=6, long_seq_len=96, long_steps=3)
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
    assert _config(corpus, long_steps=0).trained_length == 32


def _approx_job(job_config, corpus, cache, *overrides):
    return job_config(
        "model.d_model=32",
        "model.n_heads=2",
        "measure.approx_seeds=1",
        f"measure.reference.text_path={corpus}",
        f"measure.reference.cache_dir={cache}",
        "measure.reference.steps=20",
        "measure.reference.seq_len=32",
        "measure.reference.batch_size=2",
        "measure.reference.long_seq_len=64",
        "measure.reference.long_steps=2",
        "measure.reference.fit_steps=5",
        *overrides,
    )


def test_past_the_references_length_the_error_is_nan_with_a_reason(job_config, corpus, tmp_path):
    job = _approx_job(
        job_config,
        corpus,
        tmp_path,
        "seq_len=128",
        "attention=blockwise",
        "attention.block_size=16",
    )
    built = measure.setup(job)
    columns = measure.approx_columns(job, built, (1, 2, 128, 16))
    assert columns["approx_rel_error"] is None
    assert columns["swap_delta_bits_per_byte"] is None
    assert "past the reference's trained length 64" in columns["approx_error_note"]
    assert columns["approx_reference_seq_len"] == 64
    assert columns["approx_rel_error_gaussian"] > 0  # the Gaussian figure has no length limit
    within = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=full")
    columns = measure.approx_columns(within, measure.setup(within), (1, 2, 64, 16))
    assert columns["approx_rel_error"] < 1e-6 and "approx_error_note" not in columns
    assert columns["swap_delta_bits_per_byte"] == pytest.approx(0, abs=1e-5)  # exact for exact


def test_shared_qk_kernels_are_measured_on_a_shared_qk_reference(job_config, corpus, tmp_path):
    lsh = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=lsh")
    full = _approx_job(job_config, corpus, tmp_path, "seq_len=64", "attention=full")
    assert ReferenceConfig.of_job(lsh).shared_qk and not ReferenceConfig.of_job(full).shared_qk
    reference = reference_model.load_or_train(ReferenceConfig.of_job(lsh), CPU, tmp_path)
    assert reference.model.config.shared_qk and reference.digest != (
        ReferenceConfig.of_job(full).digest()
    )


@pytest.mark.parametrize(
    "attention, options", [("compressed", {"factor": 4}), ("linformer", {"k": 8})]
)
def test_a_fitted_kernel_errs_no_more_than_as_initialised(corpus, tmp_path, attention, options):
    config = _config(corpus, fit_steps=60)
    reference = reference_model.load_or_train(config, CPU, tmp_path)
    causal = attention != "linformer"
    kernel_config = variants.ModelConfig(
        d_model=32,
        n_heads=2,
        max_seq_len=64,
        attention=attention,
        attention_options=options,
        causal=causal,
    )
    exact = variants.build_attention("full", causal=causal)
    fitted, steps, length = reference_model.fitted_kernel(
        reference, kernel_config, seq_len=64, device=CPU, directory=tmp_path, exact=exact
    )
    torch.manual_seed(config.seed)
    initial = variants.layers.build_kernel(kernel_config)
    assert 0 < steps <= 60 and length == 64  # the state kept: the best on held-out text

    def error(kernel):
        inputs = measure.trained_inputs(reference, (2, 2, 64, 16), CPU, seeds=2)
        return measure.approx_rel_error(kernel, inputs, CPU, torch.float32)

    assert error(fitted) < 0.9 * error(initial)
    cached = list((tmp_path / "reference" / reference.digest).glob("kernel-*.pt"))
    assert len(cached) == 1  # cached beside the reference; a second call reads it
    again, _, _ = reference_model.fitted_kernel(
        reference, kernel_config, seq_len=64, device=CPU, directory=tmp_path, exact=exact
    )
    for a, b in zip(fitted.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_fit_that_diverges_keeps_the_state_it_started_from(corpus, tmp_path):
    """The fit keeps its best state on held-out inputs: at an absurd learning rate every step
    makes compressed's convolution worse, so it ends as initialised, at step 0."""
    reference = reference_model.load_or_train(_config(corpus), CPU, tmp_path)
    triples = [
        triple
        for index in range(3)
        for triple in reference_model.attention_inputs(
            reference, seq_len=64, batch_size=1, index=index, device=CPU, split="train"
        )
    ]
    torch.manual_seed(0)
    kernel = variants.build_attention("compressed", causal=True, factor=4, head_dim=16)
    initial = copy.deepcopy(kernel.state_dict())
    exact = variants.build_attention("full", causal=True)
    kept = reference_model.fit_kernel(
        kernel, exact, triples[:4], steps=30, lr=50.0, held_out=triples[4:]
    )
    assert kept == 0
    for name, value in kernel.state_dict().items():
        assert torch.equal(value, initial[name]), name
    unchecked = reference_model.fit_kernel(kernel, exact, triples[:4], steps=30, lr=50.0)
    assert unchecked == 30 and not torch.equal(
        kernel.state_dict()["key_conv.weight"], initial["key_conv.weight"]
    )


def test_a_length_free_kernel_is_fitted_once_at_fit_max_len_and_linformer_at_its_own(
    corpus, tmp_path
):
    config = _config(corpus, fit_steps=2, fit_max_len=32)
    assert reference_model.fit_length("compressed", 64, config) == 32
    assert reference_model.fit_length("compressed", 16, config) == 16  # shorter: its own
    assert reference_model.fit_length("linformer", 64, config) == 64  # per-position weights
    unbounded = dataclasses.replace(config, fit_max_len=0)
    assert reference_model.fit_length("compressed", 64, unbounded) == 64
    reference = reference_model.load_or_train(config, CPU, tmp_path)
    kernel_config = variants.ModelConfig(
        d_model=32, n_heads=2, max_seq_len=64, attention="compressed", causal=True
    )
    exact = variants.build_attention("full", causal=True)
    lengths = [
        reference_model.fitted_kernel(
            reference, kernel_config, seq_len=n, device=CPU, directory=tmp_path, exact=exact
        )[2]
        for n in (48, 64)
    ]
    assert lengths == [32, 32]
    assert len(list((tmp_path / "reference" / reference.digest).glob("kernel-*.pt"))) == 1
    with pytest.raises(ValueError, match="fit_max_len"):
        dataclasses.replace(config, fit_max_len=-1)


def test_kernels_without_learned_state_are_not_fitted(corpus, tmp_path):
    reference = reference_model.load_or_train(_config(corpus), CPU, tmp_path)
    sample = reference_model.attention_inputs(
        reference, seq_len=64, batch_size=1, index=0, device=CPU
    )[0]
    assert not reference_model.learns(variants.build_attention("blockwise", block_size=8), sample)
    assert not reference_model.learns(variants.build_attention("performer", head_dim=16), sample)
    routing = variants.build_attention("routing", n_heads=2, head_dim=16, window=16)
    before = routing.centroid_sums.clone()
    assert reference_model.learns(routing, sample)  # its centroids follow the queries
    assert torch.equal(routing.centroid_sums, before)  # checked on a copy


def test_a_damaged_cache_file_is_moved_aside_and_rebuilt(corpus, tmp_path, trainings, caplog):
    config = _config(corpus)
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
    config = _config(corpus, fit_steps=3)
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
        return reference_model.fitted_kernel(
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


@pytest.mark.parametrize("attention, causal", [("nsa", True), ("linformer", False)])
def test_one_fit_serves_every_job_length_unless_the_state_is_per_position(attention, causal):
    """Jobs at 2048 and 4096 tokens fit NSA at the same 1024 tokens: one key, one fit (each
    length had its own before, as the job's length bound was in the key). Linformer's E, F
    span max_seq_len: a fit per length."""
    config = ReferenceConfig(d_model=32, n_heads=2)
    keys = set()
    for seq_len in (2048, 4096):
        kernel_config = variants.ModelConfig(
            d_model=32, n_heads=2, max_seq_len=seq_len, attention=attention, causal=causal
        )
        length = reference_model.fit_length(attention, seq_len, config)
        keys.add(reference_model.kernel_key(kernel_config, length, config))
    assert len(keys) == (1 if attention == "nsa" else 2)
