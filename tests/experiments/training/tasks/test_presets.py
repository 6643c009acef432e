"""The quality presets compose into buildable jobs, and Table 2's "full" row is shared-QK."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import variants
from experiments.app import resolvers
from experiments.job_config import JobConfig
from experiments.measurement import measure
from experiments.training.tasks import mad as mad_task
from tests.experiments.conftest import CONF

ROOT = CONF.parent

# preset -> the sweep values of its one swept key
PRESETS = {
    "reformer_table2": ("train_as", ["full", "lsh-1", "lsh-2", "lsh-4"]),
    "shared_qk": ("model.shared_qk", ["false", "true"]),
    "reversible_quality": ("block", ["residual", "reversible"]),
    "quality_speed": (
        "train_as",
        ["full", "linformer-8", "linformer-32", "lsh-1", "lsh-2", "lsh-4"],
    ),
}
JOBS = [(preset, f"{key}={value}") for preset, (key, values) in PRESETS.items() for value in values]


@pytest.mark.parametrize("preset, override", JOBS)
def test_every_job_of_a_preset_builds(resolved_config, preset, override):
    config = resolved_config(f"+experiment={preset}", override)
    built = measure.setup(JobConfig.of(config))
    assert config["sweep"] == preset
    assert built.task.name == config["task"]["name"]
    kernel = next(iter(built.model.kernels()))
    assert kernel.name == config["attention"]["name"]


def test_table2_rows_train_with_their_eval_label(resolved_config):
    for row in PRESETS["reformer_table2"][1]:
        config = resolved_config("+experiment=reformer_table2", f"train_as={row}")
        assert config["attention"] == config["eval"]["attention"][row]
        assert config["model"]["shared_qk"] is True


def test_table2_full_row_is_the_full_kernel_under_shared_qk(resolved_config):
    """Its keys and self-mask follow the LSH rows' conventions (tests/variants/attention/
    test_full.py checks that full and one-chunk LSH agree)."""
    config = resolved_config("+experiment=reformer_table2", "train_as=full")
    kernel = measure.setup(JobConfig.of(config)).kernel
    assert kernel.name == "full" and kernel.shared_qk and kernel.causal


def _swept(preset: str) -> dict[str, list[str]]:
    resolvers.register()  # `${variants:...}` lists, read without composing
    params = OmegaConf.load(CONF / "experiment" / f"{preset}.yaml").hydra.sweeper.params
    return {key: str(values).split(",") for key, values in params.items()}


def test_long_range_trains_every_registered_variant_with_two_seeds_or_more():
    swept = _swept("long_range")
    assert sorted(swept["attention"]) == sorted(variants.attention_names())
    assert len(swept["seed"]) >= 2


def test_long_range_quick_reorders_the_variants_but_keeps_every_one_once():
    # its list is ordered slowest first (a scheduling choice); it must stay the whole registry
    quick = _swept("long_range_quick")["attention"]
    assert sorted(quick) == sorted(variants.attention_names())
    assert len(quick) == len(set(quick))


@pytest.mark.parametrize("attention", variants.attention_names())
def test_every_long_range_job_builds_causal_where_its_variant_can_be(job_config, attention):
    job = job_config("+experiment=long_range", f"attention={attention}")
    built = measure.setup(job)
    kernel = next(iter(built.model.kernels()))
    assert kernel.name == variants.attention_spec(attention).cls.name
    assert built.task.name == "long_recall"
    assert kernel.causal == variants.attention_spec(attention).causal_supported
    stages = job.stages
    assert [s.seq_len for s in stages] == [64, 128, 256, 512, 1024, 2048]
    assert {s.seq_len * s.batch_size for s in stages} == {2048}  # tokens per step


def _capacity_sweep() -> dict[str, list[str]]:
    params = OmegaConf.load(CONF / "experiment" / "capacity.yaml").hydra.sweeper.params
    return {key: str(values).split(",") for key, values in params.items()}


def test_every_job_of_the_capacity_preset_builds(resolved_config):
    sweep = _capacity_sweep()
    assert set(sweep) == {"attention", "model.n_heads", "seed", "train.lr"}
    assert len(sweep["train.lr"]) >= 3  # a learning-rate grid per variant
    # The grid runs at one seed and head dim; `make capacity-seeds` adds seed 1 and head dim 32
    # at each variant's chosen rate.
    second_half = (ROOT / "Makefile").read_text().split("capacity-seeds:")[1].split("\n\n")[0]
    assert "seed=0,1 model.n_heads=4,2" in second_half
    names = set()
    for attention in sweep["attention"]:
        for heads in ("4", "2"):
            config = resolved_config(
                "+experiment=capacity", f"attention={attention}", f"model.n_heads={heads}"
            )
            assert config["sweep"] == "capacity" and config["task"]["distinct_values"]
            built = measure.setup(JobConfig.of(config))
            kernel = next(iter(built.model.kernels()))
            assert kernel.name == config["attention"]["name"] and kernel.causal
            assert built.model.config.head_dim in (16, 32)
            names.add(kernel.name)
            # One model per job, evaluated at every count of the mixture (the job's own first).
            task = built.task
            assert task.train_pairs == (4, 8, 16, 32, 64) and task.n_pairs == 4
            assert task.n_values >= 256
            # Zoology's mixture of lengths: every kernel trains at each count's own length.
            assert task.train_lengths == (64, 128, 256, 256, 256)
            for length in sorted(set(task.train_lengths)):
                tokens = torch.randint(task.vocab_size, (2, length))
                built.model(tokens).sum().backward()  # runs at that length: no shape constraint
    assert names >= {"full", "lsh", "routing", "compressed", "linear", "performer"}
    assert names >= {"deltanet", "moba", "nsa", "gated_deltanet", "mamba2", "sliding_window"}


@pytest.mark.parametrize(
    "setting, seen",
    [
        ("moba_small", lambda a: a["block_size"] * a["top_k"]),
        ("nsa_small", lambda a: a["block_size"] * a["n_select"] + a["window"]),
    ],
)
def test_block_selection_in_the_capacity_preset_does_not_see_every_key(
    resolved_config, setting, seen
):
    """At 256 tokens their default blocks (MoBA 4 x 128; NSA 16 x 64 and a 512 window) cover
    every key: the preset's settings leave a query at most a third of them, by content."""
    config = resolved_config("+experiment=capacity", f"attention={setting}")
    assert seen(config["attention"]) <= config["seq_len"] // 3
    assert setting in _capacity_sweep()["attention"]


@pytest.mark.parametrize("attention", variants.attention_names())
def test_long_range_quick_trains_each_variant_at_the_rate_its_grid_chose(
    resolved_config, attention
):
    """The main job's quality half reads conf/tuned/long_range_quick.yaml (written from the
    grid by `analysis.tuning --write`): a variant it holds trains at that rate, one of the
    grid's; one it lacks (a new variant or a plugin before its grid) at config.yaml's rate."""
    table = OmegaConf.to_container(OmegaConf.load(CONF / "tuned" / "long_range_quick.yaml"))
    config = resolved_config("+experiment=long_range_quick", f"attention={attention}")
    name = config["attention"]["name"]
    if table.get(name) is None:
        assert config["train"]["lr"] == resolved_config()["train"]["lr"]  # untuned
    else:
        assert config["train"]["lr"] == table[name]
        assert table[name] in (1e-3, 3e-3, 1e-2)
    # The grid stays one override away, and wins over the table.
    assert resolved_config("+experiment=long_range_quick", "train.lr=0.01")["train"]["lr"] == 0.01


def test_the_mad_preset_runs_every_variant_on_every_kind_on_mads_grid():
    swept = _swept("mad")
    assert sorted(swept["attention"]) == sorted(variants.attention_names())
    assert swept["task.kind"] == list(mad_task.KINDS)
    assert swept["train.lr"] == ["1.0e-3", "3.0e-3", "1.0e-2"]
    assert swept["train.weight_decay"] == ["0.0", "0.1"]  # MAD's


@pytest.mark.parametrize("kind", mad_task.KINDS)
def test_every_mad_kind_builds_at_its_setting_with_its_readout(resolved_config, kind):
    config = resolved_config("+experiment=mad", f"task.kind={kind}", "attention=linformer")
    setting = OmegaConf.load(CONF / "experiment" / "mad.yaml").mad_settings[kind]
    assert config["seq_len"] == setting.seq_len and config["train"]["steps"] == setting.steps
    built = measure.setup(JobConfig.of(config))
    assert built.task.kind == kind and built.task.vocab_size == setting.vocab_size
    assert built.model.config.readout == ("pooled" if kind == "compression" else "tokens")
    assert not built.model.config.causal  # Linformer cannot be: it trains bidirectionally
    batch = built.task.batch("train", 0)
    assert batch.inputs.shape == (config["batch_size"], config["seq_len"])
    built.model(batch.inputs).sum().backward()


def test_the_listops_preset_runs_every_variant_on_an_lr_grid(resolved_config):
    swept = _swept("listops")
    assert sorted(swept["attention"]) == sorted(variants.attention_names())
    assert len(swept["train.lr"]) == 2  # the grid cut to fit the budget (its YAML says why)
    config = resolved_config("+experiment=listops", "attention=full")
    built = measure.setup(JobConfig.of(config))
    assert built.task.name == "listops" and config["seq_len"] < 2000
