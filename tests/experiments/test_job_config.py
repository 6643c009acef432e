"""JobConfig: the resolved Hydra config as one typed object, checked before anything is built."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys

import pytest

import variants
from experiments import job_config as job_config_module
from experiments.job_config import (
    BudgetConfig,
    JobConfig,
    JobIdentity,
    MeasureConfig,
    TrainConfig,
    added_keys,
    check_added_keys,
    check_required_keys,
    check_writable_dir,
)
from experiments.records import record
from tests.experiments.conftest import ROOT


def test_every_key_of_the_default_config_has_a_typed_home(resolved_config):
    config = resolved_config()
    job = JobConfig.of(config)
    for node, typed in (("train", job.train), ("measure", job.measure), ("budget", job.budget)):
        assert set(config[node]) == {f.name for f in dataclasses.fields(typed)}, node
    assert job.train == TrainConfig(**config["train"])
    model = job.model_config(vocab_size=256)
    assert isinstance(model, variants.ModelConfig)
    assert (model.max_seq_len, model.attention, model.block) == (job.seq_len, "full", "residual")
    assert model.depth == config["model"]["depth"] and model.shared_qk is False


def test_the_model_config_carries_the_attention_options(job_config):
    job = job_config("attention=lsh", "attention.n_hashes=2")
    model = job.model_config(vocab_size=256)
    assert model.attention == "lsh" and model.attention_options["n_hashes"] == 2
    assert "name" not in model.attention_options and model.shared_qk is True


@pytest.mark.parametrize(
    "override, message",
    [
        ("+model.dpth=3", "option 'model.dpth' is unknown; model options: d_model"),
        ("+train.stepz=3", "option 'train.stepz' is unknown"),
        ("train.steps=-1", "'train.steps' must be a non-negative integer"),
        ("measure.min_run_time_s=0", "'measure.min_run_time_s' must be a positive number or null"),
        ("budget.max_seconds=abc", "'budget.max_seconds' must be a positive number or null"),
        ("seq_len=0", "'seq_len' must be a positive integer"),
    ],
)
def test_bad_keys_are_refused_naming_them(resolved_config, override, message):
    with pytest.raises(ValueError, match=message):
        JobConfig.of(resolved_config(override))


def test_a_missing_key_is_named(resolved_config):
    config = resolved_config()
    del config["measure"]["warmup"]
    with pytest.raises(ValueError, match="'measure.warmup' is missing"):
        JobConfig.of(config)


def test_settings_stay_as_written():
    """Not Hydra structured configs: an int given for a float is kept, so the hash stays."""
    assert BudgetConfig(max_memory_gb=16, max_seconds=None).max_memory_gb == 16
    measure = MeasureConfig(
        kernel=True,
        step=True,
        memory=True,
        min_run_time_s=1,
        warmup=0,
        approx_error=False,
        approx_seeds=1,
        reference={},
        matmul_size=64,
    )
    assert type(measure.min_run_time_s) is int


def test_only_top_level_keys_the_command_line_adds_are_unknown():
    groups = ["attention", "block", "task", "logger", "experiment", "hydra/launcher"]
    overrides = ["+experiment=quality_speed", "train_as=lsh-2", "+seqlen=128", "+model.x=1"]
    assert added_keys(overrides, groups) == ["seqlen"]  # groups, set and nested keys are not
    assert added_keys(["++seqlen=128", "seq_len=64"], groups) == []  # ++ adds on purpose
    check_added_keys({"seq_len": 1, "seed": 0}, [])
    with pytest.raises(ValueError, match=r"'seqlen' \(added with \+seqlen=\) .* 'seq_len'\?"):
        check_added_keys({"seq_len": 1, "seed": 0, "seqlen": 128}, ["seqlen"])
    with pytest.raises(ValueError, match="top-level options: seed, seq_len"):
        check_added_keys({"seq_len": 1, "seed": 0, "zzz": 1}, ["zzz"])


def test_keys_a_preset_declares_are_not_added_keys(resolved_config):
    config = resolved_config("+experiment=quality_speed", "train_as=lsh-2")
    assert config["train_as"] == "lsh-2" and config["attention"]["name"] == "lsh"
    JobConfig.of(config)  # and the job's config is valid


# --- The resolved config: read once, what every record takes from it ---------------------------


def test_the_record_identity_is_the_resolved_dicts_computed_once(resolved_config):
    config = resolved_config("attention=lsh", "sweep=s", "+experiment=quality_speed")
    identity = JobIdentity(config)
    assert identity.config_hash == record.config_hash(config)
    assert identity.columns == record.config_columns(config)
    assert (identity.sweep, identity.resume, identity.logger) == (
        config["sweep"],
        config["resume"],
        config["logger"],
    )
    job = JobConfig.of(config)
    # The typed job is plain data: no copy of the composed tree, no identity of its own.
    assert not hasattr(job, "tree") and not hasattr(job, "hash") and job == JobConfig.of(config)
    assert (job.seq_len, job.attention_name) == (config["seq_len"], config["attention"]["name"])


@pytest.mark.parametrize(
    "overrides, shared_qk",
    [
        ((), False),  # null: what full attention requires
        (("attention=lsh",), True),  # null: LSH requires it
        (("model.shared_qk=true",), True),
        (("attention=lsh", "model.shared_qk=false"), False),  # kept; the model refuses it
        (("attention.name=nope",), None),  # an unknown variant: the job's error says which
        (("attention.name=nope", "model.shared_qk=true"), True),
    ],
)
def test_shared_qk_is_resolved_from_the_variant_when_null(resolved_config, overrides, shared_qk):
    assert JobIdentity(resolved_config(*overrides)).shared_qk is shared_qk


def test_the_typed_job_resolves_shared_qk_as_its_model_does(job_config):
    for overrides in ((), ("attention=lsh",), ("model.shared_qk=true",)):
        job = job_config(*overrides)
        assert job.shared_qk is job.model_config(vocab_size=256).shared_qk


@pytest.mark.parametrize(
    "overrides, head_dim, n_kv_heads",
    [
        ((), 64, 4),  # conf/config.yaml: d_model 256, 4 heads, n_kv_heads null
        (("model.n_heads=8", "model.n_kv_heads=2"), 32, 2),
        (("model.n_heads=3",), None, 3),  # 256 / 3: the job's check says why
    ],
)
def test_head_dim_and_kv_heads_are_resolved_columns(
    resolved_config, overrides, head_dim, n_kv_heads
):
    columns = JobIdentity(resolved_config(*overrides)).columns
    assert (columns["head_dim"], columns["n_kv_heads"]) == (head_dim, n_kv_heads)


def test_an_added_key_is_refused_when_the_job_is_typed(resolved_config):
    config = resolved_config("+seqlen=128")
    JobConfig.of(config)  # not named as added: a key like any other
    with pytest.raises(ValueError, match=r"'seqlen' \(added with \+seqlen=\)"):
        JobConfig.of(config, added=["seqlen"])


def test_config_and_curriculum_import_alone_without_a_cycle_or_torch():
    """curriculum is a leaf (plain values in, stages out); config starts no torch on import."""
    code = (
        "import sys\n"
        "import experiments.training.curriculum\n"
        "print('experiments.job_config' in sys.modules)\n"
        "import experiments.job_config\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("threads", [0, -3, 1.5, True, "4"])
def test_threads_must_be_a_positive_integer_or_null(resolved_config, threads):
    config = resolved_config()
    config["threads"] = threads
    with pytest.raises(ValueError, match=r"option 'threads' must be a positive integer or null"):
        JobConfig.of(config)


def test_threads_null_or_positive_is_accepted(job_config):
    assert job_config("threads=null").threads is None
    assert job_config("threads=2").threads == 2


@pytest.mark.parametrize("key", ["seq_len", "model.depth", "dtype"])
def test_a_deleted_required_key_is_named(resolved_config, key):
    config = resolved_config(f"~{key}")
    message = f"config: option '{key}' is missing; every job needs it (was it deleted with ~{key}?)"
    with pytest.raises(ValueError) as refused:
        check_required_keys(config)
    assert str(refused.value) == message  # at the door (experiments/run.py), once


def test_a_directory_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    check_writable_dir("hydra.sweep.dir", tmp_path / "new" / "sweep")  # created
    assert (tmp_path / "new" / "sweep").is_dir() and not list(
        (tmp_path / "new" / "sweep").iterdir()
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError) as refused:
        check_writable_dir("hydra.sweep.dir", blocker / "sweep")
    assert str(refused.value) == (
        f"config: option 'hydra.sweep.dir': cannot write to {blocker / 'sweep'} (Not a directory)"
    )

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(job_config_module.tempfile, "TemporaryFile", read_only)
    with pytest.raises(ValueError, match=r"cannot write to .* \(Read-only file system\)"):
        check_writable_dir("hydra.run.dir", tmp_path)


def _stderr_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_cli_refuses_a_deleted_key_and_an_unwritable_sweep_dir_in_one_line(cli, tmp_path):
    """`~seq_len` and a sweep dir that cannot be written (here: below a regular file, as a
    read-only one for a user who is not root) each end the app with one line, exit 2."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    deleted = cli.start(*cli.sweep_args(tmp_path / "sweep", "~seq_len", "logger=none"))
    unwritable = cli.start(*cli.sweep_args(blocker / "sweep", "logger=none"))
    for process, words in (
        (deleted, "error: config: option 'seq_len' is missing"),
        (unwritable, f"error: config: option 'hydra.sweep.dir': cannot write to {blocker}"),
    ):
        stdout, stderr = process.communicate(timeout=120)
        done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        lines = _stderr_lines(done)
        assert done.returncode == 2 and len(lines) == 1, stderr[-2000:]
        assert lines[0].startswith(words), lines
    assert not list((tmp_path / "sweep").glob("*/result.json"))
