"""Hybrid stacks through the app: model.layers in a job's config, its record, a CLI sweep, and
the hybrid preset."""

from __future__ import annotations

import json

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments.app import plugin_options
from experiments.job_config import JobConfig, JobIdentity
from experiments.measurement import measure
from experiments.records import record
from tests.experiments.conftest import CONF, MEASURE_NOTHING
from variants import ModelConfig


@pytest.mark.parametrize(
    ("layers", "words"),
    [
        ("[linear,nope]", "option 'layers' entry 1: unknown attention variant 'nope'"),
        ("[linear,linear,full]", "option 'depth'=4 must be a multiple of the length of option"),
    ],
)
def test_a_bad_model_layers_is_one_value_error_naming_the_option(job_config, layers, words):
    job = job_config("model.depth=4", f"model.layers={layers}")
    with pytest.raises(ValueError, match=words):
        measure.setup(job)


def test_the_jobs_model_is_the_stack_model_layers_names(resolved_config):
    plugin_options.store_group_options()  # sliding_window has no YAML: the app stores its options
    config = resolved_config(
        "attention=sliding_window",
        "attention.window=8",
        "seq_len=32",
        "model.d_model=16",
        "model.n_heads=2",
        "model.depth=4",
        "model.layers=[sliding_window,{name: full, impl: math}]",
    )
    job = JobConfig.of(config)
    kernels = list(measure.setup(job).model.kernels())
    assert [k.name for k in kernels] == ["sliding_window", "full"] * 2
    assert kernels[0].window == 8 and kernels[1].impl == "math"
    assert JobIdentity(config).columns["layers"] == "sliding_window+full(impl=math)"


@pytest.mark.slow
def test_a_cli_sweep_of_stacks_records_each_stack(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    cli.sweep(
        sweep_dir,
        "seq_len=32",
        "logger=none",
        "report=false",
        "train.steps=1",
        *MEASURE_NOTHING,
        "measure.step=true",
        "measure.decode=true",
        "measure.decode_steps=2",
        "measure.decode_scope=model",
        "attention=linear",
        "model.depth=2",
        "model.layers=null,[linear,full]",
    )
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    records.sort(key=lambda r: r["layers"])  # dirs are named by hash: no launch order
    assert [r["status"] for r in records] == ["ok", "ok"], [r["error"] for r in records]
    assert [r["layers"] for r in records] == ["linear", "linear+full"]
    assert all(r["attention"] == "linear" for r in records)
    plain, hybrid = records
    assert hybrid["decode_state_bytes"] > plain["decode_state_bytes"] > 0  # full's cache grows
    assert hybrid["step_ms"] > 0 and hybrid["decode_ms_per_token"] > 0


def test_the_preset_compares_each_efficient_layer_at_four_shares_of_full(resolved_config):
    swept = OmegaConf.load(CONF / "experiment" / "hybrid.yaml").hydra.sweeper.params
    points = str(swept["experiment/hybrid@_global_"]).split(",")
    assert sorted(points) == ["cost_1024", "cost_256", "cost_4096", "recall_1024"]
    [override] = OverridesParser.create().parse_overrides([f"model.layers={swept['model.layers']}"])
    patterns = list(override.sweep_iterator())
    assert len(patterns) == 13 and patterns[-1] is None
    stacks = [record.stack_label(p, "full") for p in patterns]
    for efficient in ("gated_deltanet", "mamba2", "sliding_window"):
        assert {efficient, f"3×{efficient}+full", f"{efficient}+full"} <= set(stacks)
    assert "full" in stacks
    assert len(set(stacks)) == 13
    for pattern in patterns:
        ModelConfig(depth=4, layers=pattern)  # every stack fits the preset's depth
    for point in points:
        job = JobConfig.of(
            resolved_config("+experiment=hybrid", f"experiment/hybrid@_global_={point}")
        )
        model = job.model_config(vocab_size=64)
        assert (model.depth, model.d_model, job.attention_name) == (4, 64, "full")
        if point.startswith("cost"):
            assert job.train.steps == 0 and job.measure.step and job.measure.decode
            assert job.measure.decode_scope == "model"
            assert job.seq_len == int(point.split("_")[1]) and job.task["name"] == "random_lm"
        else:
            assert job.task["name"] == "long_recall" and job.seq_len == 1024
            assert job.train.steps > 0 and not job.measure.step and not job.measure.decode
