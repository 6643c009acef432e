"""The `heads` preset: head dim and KV heads as sweep axes, and a real job's record of them."""

from __future__ import annotations

from omegaconf import OmegaConf

from experiments.app.job import run_job
from experiments.job_config import JobConfig, JobIdentity
from tests.experiments.conftest import CONF


def test_the_preset_sweeps_head_dim_at_fixed_width_and_kv_heads_at_4k_and_16k(resolved_config):
    swept = OmegaConf.load(CONF / "experiment" / "heads.yaml").hydra.sweeper.params
    assert str(swept["seq_len"]) == "4096,16384"
    assert str(swept["model.n_kv_heads"]) == "1,2,null"
    head_dims = set()
    for n_heads in str(swept["model.n_heads"]).split(","):
        for n_kv_heads in ("1", "2", "null"):
            config = resolved_config(
                "+experiment=heads", f"model.n_heads={n_heads}", f"model.n_kv_heads={n_kv_heads}"
            )
            job = JobConfig.of(config)
            model = job.model_config(vocab_size=256)
            assert (model.d_model, model.depth, model.causal) == (256, 1, True)
            assert model.kv_heads == (int(n_heads) if n_kv_heads == "null" else int(n_kv_heads))
            assert job.measure.kernel and job.measure.memory and not job.measure.step
            assert not job.measure.approx_error and job.train.steps == 0
            columns = JobIdentity(config).columns
            assert (columns["head_dim"], columns["n_kv_heads"]) == (model.head_dim, model.kv_heads)
            head_dims.add(model.head_dim)
    assert head_dims == {32, 64, 128}


def test_a_grouped_heads_job_records_head_dim_and_n_kv_heads(resolved_config, tmp_path):
    overrides = ("+experiment=heads", "logger=none", "seq_len=64", "model.n_heads=4")
    fast = ("measure.min_run_time_s=0.01", "measure.rounds=1", "measure.matmul_size=64")
    config = resolved_config(*overrides, *fast, "model.n_kv_heads=2", "attention=blockwise")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "ok", rec["error"]
    assert (rec["head_dim"], rec["n_kv_heads"], rec["n_heads"]) == (64, 2, 4)
    assert rec["attn_fwd_bwd_ms"] > 0 and rec["attn_fwd_bwd_peak_bytes"] > 0
    # LSH's keys are its queries: grouped KV heads are a skipped record, with the columns.
    config = resolved_config(*overrides, *fast, "model.n_kv_heads=2", "attention=lsh")
    rec = run_job(config, tmp_path / "1", job="1", sweep_dir=None)
    assert rec["status"] == "skipped" and "n_kv_heads" in rec["error"]
    assert (rec["head_dim"], rec["n_kv_heads"]) == (64, 2)


def test_a_grouped_heads_kernel_is_timed_on_keys_of_n_kv_heads(monkeypatch):
    import torch

    import variants
    from experiments.measurement import kernel_rounds

    kernel = variants.build_attention("full", causal=True)
    seen = []
    monkeypatch.setattr(kernel, "forward", lambda q, k, v, gates=None: seen.append(k.shape) or q)
    fwd, _ = kernel_rounds.kernel_calls(
        kernel, (1, 4, 32, 8), torch.device("cpu"), torch.float32, 2
    )
    fwd()
    assert seen == [(1, 2, 32, 8)]
