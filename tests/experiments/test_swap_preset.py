"""The `swap` preset: transformers' Llama trained on a variant (`model.family=hf_llama`), and a
real job's record of it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from experiments.app.job import run_job
from experiments.job_config import JobConfig, JobIdentity
from tests.experiments.conftest import CONF

pytest.importorskip("transformers")

FAST = (
    "+experiment=swap", "logger=none", "seq_len=64", "train.steps=4", "train.warmup=1",
    "train.eval_every=2", "train.eval_batches=1", "measure.min_run_time_s=0.01",
)  # fmt: skip


def test_the_preset_trains_a_grouped_llama_on_text_at_1024_over_an_lr_grid(resolved_config):
    swept = OmegaConf.load(CONF / "experiment" / "swap.yaml").hydra.sweeper.params
    assert len(str(swept["train.lr"]).split(",")) >= 3
    config = resolved_config("+experiment=swap")
    job = JobConfig.of(config)
    model = job.model_config(vocab_size=256)
    assert (model.family, model.positions, model.kv_heads, model.n_heads) == (
        "hf_llama", "rotary", 2, 4,
    )  # fmt: skip
    assert job.seq_len == 1024 and job.task["name"] == "text"
    assert job.measure.step and job.train.steps > 0
    assert JobIdentity(config).columns["model.family"] == "hf_llama"


def test_a_swap_job_records_bits_per_byte_and_step_time(resolved_config, tmp_path):
    config = resolved_config(*FAST, "attention=linear")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "ok", rec["error"]
    assert rec["eval_bits_per_byte"] > 0 and rec["step_ms"] > 0
    assert rec["model.family"] == "hf_llama" and rec["n_kv_heads"] == 2
    # The rate is chosen on held-out bytes: validated on them, so valid_loss is recorded ...
    assert rec["task.valid_fraction"] > 0 and rec["valid_loss"] > 0
    # ... and never on the eval split it reports (no held-out bytes: no valid_loss).
    config = resolved_config(*FAST, "attention=linear", "task.valid_fraction=0.0")
    rec = run_job(config, tmp_path / "2", job="2", sweep_dir=None)
    assert rec["status"] == "ok", rec["error"]
    assert rec.get("valid_loss") is None
    # A variant HF cannot run is a skipped record that says why.
    config = resolved_config(*FAST, "attention=deltanet")
    rec = run_job(config, tmp_path / "1", job="1", sweep_dir=None)
    assert rec["status"] == "skipped" and "gates per token" in rec["error"]


def test_evaluating_with_other_kernels_needs_our_model(resolved_config):
    with pytest.raises(ValueError, match="'eval.attention'.*'model.family'='attnbench'"):
        JobConfig.of(resolved_config("+experiment=swap", "+eval.attention.lsh.name=lsh"))
