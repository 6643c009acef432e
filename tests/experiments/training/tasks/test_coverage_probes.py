"""The coverage_probes preset: each probe is its base preset's job with a pattern that covers
the sequence at the length it explains, and each probe file is swept exactly once."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from experiments.job_config import JobConfig
from experiments.measurement import measure
from tests.experiments.conftest import CONF
from tests.reference import causal_mask, dense_attention, qkv, shared_qk_reference

PROBES = CONF / "experiment" / "coverage_probes"
SWEPT = str(
    OmegaConf.load(CONF / "experiment" / "coverage_probes.yaml").hydra.sweeper.params[
        "experiment/coverage_probes@_global_"
    ]
)
NAMES = [name.strip() for name in SWEPT.split(",")]
BASES = ("long_range_quick", "long_range", "capacity")  # the longest prefix first


def base_of(probe: str) -> str:
    return next(base for base in BASES if probe.startswith(base + "_"))


def covered_length(config: dict) -> int:
    """The length a probe must cover: a long-range preset's control (its first stage), or
    capacity's one length."""
    curriculum = config["train"]["curriculum"]
    return curriculum[0]["seq_len"] if curriculum else config["seq_len"]


def test_every_probe_file_is_swept_once():
    assert sorted(NAMES) == sorted(p.stem for p in PROBES.glob("*.yaml"))
    assert len(NAMES) == len(set(NAMES))


@pytest.mark.parametrize("probe", NAMES)
def test_a_probe_is_its_base_presets_job_but_for_the_attentions_options(resolved_config, probe):
    config = resolved_config(
        "+experiment=coverage_probes", f"experiment/coverage_probes@_global_={probe}"
    )
    name = config["attention"]["name"]
    base = resolved_config(f"+experiment={base_of(probe)}", f"attention={name}")
    assert config["sweep"] == "coverage_probes"
    for key in ("task", "seq_len", "batch_size", "model"):
        assert config[key] == base[key], key
    for key in ("curriculum", "steps", "warmup", "stop_accuracy", "patience", "eval_pairs"):
        assert config["train"][key] == base["train"][key], key
    if base_of(probe) != "capacity":  # capacity has no tuned table: the probe names its rate
        assert config["train"]["lr"] == base["train"]["lr"]
    built = measure.setup(JobConfig.of(config))
    assert next(iter(built.model.kernels())).name == name


# probe -> does its pattern let every query see every key at `length`?
COVERS = {
    "moba": lambda a, length: a["block_size"] * a["top_k"] >= length,
    "routing": lambda a, length: a["n_clusters"] == 1 and a["window"] >= length,
    "strided": lambda a, length: a["stride"] >= length,
    "compressed": lambda a, length: a["factor"] == 1,
    "linformer": lambda a, length: a["k"] >= length and a["init"] == "identity",
    "performer": lambda a, length: True,  # no pattern: every key, through features
    "mamba2": lambda a, length: True,  # no pattern: every key, through its state
}


@pytest.mark.parametrize("probe", NAMES)
def test_a_probes_pattern_covers_the_length_it_explains(resolved_config, probe):
    config = resolved_config(
        "+experiment=coverage_probes", f"experiment/coverage_probes@_global_={probe}"
    )
    attention = config["attention"]
    assert COVERS[attention["name"]](attention, covered_length(config))


# Compressed's and Performer's maps are learned or drawn, Mamba-2's a recurrence: no probe of
# theirs is exact attention.
EXACT = [p for p in NAMES if not any(v in p for v in ("compressed", "performer", "mamba2"))]


@pytest.mark.parametrize("probe", EXACT)
def test_a_covering_kernel_is_exact_attention_at_that_length(resolved_config, probe):
    """Built as the job builds it, at the length it covers, the kernel is exact attention:
    causal softmax over every earlier key (moba, strided); routing's shared-QK form
    (`shared_qk_reference`); Linformer's bidirectional one plus its k - L null slots."""
    config = resolved_config(
        "+experiment=coverage_probes", f"experiment/coverage_probes@_global_={probe}"
    )
    kernel = next(iter(measure.setup(JobConfig.of(config)).model.kernels())).double().eval()
    model, length = config["model"], covered_length(config)
    q, k, v = qkv(1, model["n_heads"], length, model["d_model"] // model["n_heads"])
    name = config["attention"]["name"]
    if name == "linformer":
        null = torch.zeros(*k.shape[:2], config["attention"]["k"] - length, k.shape[-1])
        nulls = null.to(k.dtype)
        expected = dense_attention(q, torch.cat([k, nulls], 2), torch.cat([v, nulls], 2))
        torch.testing.assert_close(kernel(q, k, v), expected)
    elif name == "routing":
        torch.testing.assert_close(kernel(q, q, v), shared_qk_reference(q, v, causal_mask(length)))
    else:
        torch.testing.assert_close(kernel(q, k, v), dense_attention(q, k, v, causal_mask(length)))
