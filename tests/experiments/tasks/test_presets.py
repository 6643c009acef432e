"""The quality presets compose into buildable jobs, and Table 2's "full" kernel is exact."""

from __future__ import annotations

import pytest
import torch

from experiments import measure
from tests.reference import causal_mask, dense_attention, qkv

# preset -> the sweep values of its one swept key
PRESETS = {
    "reformer_table2": ("train_as", ["full", "lsh-1", "lsh-2", "lsh-4"]),
    "shared_qk": ("model.shared_qk", ["false", "true"]),
    "reversible_quality": ("block", ["residual", "reversible"]),
    "quality_speed": ("train_as", ["full", "linformer-8", "linformer-32", "lsh-1", "lsh-2",
                                   "lsh-4"]),
}
JOBS = [(preset, f"{key}={value}") for preset, (key, values) in PRESETS.items() for value in values]


@pytest.mark.parametrize("preset, override", JOBS)
def test_every_job_of_a_preset_builds(resolved_config, preset, override):
    config = resolved_config(f"+experiment={preset}", override)
    built = measure.setup(config)
    assert config["sweep"] == preset
    assert built.task.name == config["task"]["name"]
    kernel = next(iter(built.model.kernels()))
    assert kernel.name == config["attention"]["name"]


def test_table2_rows_train_with_their_eval_label(resolved_config):
    for row in PRESETS["reformer_table2"][1]:
        config = resolved_config("+experiment=reformer_table2", f"train_as={row}")
        assert config["attention"] == config["eval"]["attention"][row]
        assert config["model"]["shared_qk"] is True
    assert config["eval"]["attention"]["full"]["bucket_size"] == config["seq_len"]


def test_one_round_one_chunk_lsh_is_exact_causal_attention_without_self():
    # Table 2's "full": every earlier key, except the token itself (its first position has only
    # itself, so it keeps it), with the LSH kernel's scores q . k / (|k| sqrt(d)).
    from variants import build_attention

    q, _, v = qkv(batch=2, heads=2, length=16, head_dim=8)
    kernel = build_attention("lsh", causal=True, n_hashes=1, bucket_size=16)
    keys = torch.nn.functional.normalize(q, dim=-1)
    mask = causal_mask(16) & ~torch.eye(16, dtype=torch.bool)
    mask[0, 0] = True
    expected = dense_attention(q, keys, v, mask=mask)
    torch.testing.assert_close(kernel(q, q, v), expected)
