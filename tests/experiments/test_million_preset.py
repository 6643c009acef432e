"""The `million` preset: the 2^20-token step of `benchmarks.targets --million` as Hydra jobs."""

from __future__ import annotations

from omegaconf import OmegaConf

from benchmarks.targets import million, steps
from experiments.job_config import JobConfig
from tests.experiments.conftest import CONF


def test_million_jobs_are_the_benchmark_rows_with_the_switches_on(resolved_config):
    swept = OmegaConf.load(CONF / "experiment" / "million.yaml").hydra.sweeper.params
    attentions = str(swept["attention"]).split(",")  # the registry's `million` variants
    assert attentions == million.million_kernels()
    for attention in attentions:
        config = resolved_config("+experiment=million", f"attention={attention}")
        model = JobConfig.of(config).model_config(vocab_size=256)
        assert (model.max_seq_len, model.d_model, model.n_heads) == (2**20, 256, 4)
        assert model.causal and model.depth == 1
        switches = {k: getattr(model, k) for k in steps.MILLION_SWITCHES}
        assert switches == steps.MILLION_SWITCHES


def test_the_switches_are_off_in_every_other_job(resolved_config):
    model = JobConfig.of(resolved_config()).model_config(vocab_size=256)
    assert (model.ff_chunks, model.loss_chunks, model.attention_chunks) == (1, 1, 1)
