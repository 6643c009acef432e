"""The lookup-weight table: weights read off a kernel's outputs are its attention's, and the
table's rows are what the page shows."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import lookup_weight
from variants.registry import build_attention


def test_weights_read_off_the_outputs_are_softmax_attention_for_full():
    keys = lookup_weight.lookup(4, seed=3, length=48, head_dim=16)  # 48: three column blocks
    matrix = lookup_weight.weights(build_attention("full").double(), keys)
    logits = keys[0, 0] @ keys[0, 0].T / math.sqrt(16)
    torch.testing.assert_close(matrix, torch.softmax(logits, dim=-1))


def test_the_gap_is_the_exact_logit_of_the_match():
    keys = lookup_weight.lookup(6, seed=0, length=8, head_dim=32)
    logits = keys[0, 0] @ keys[0, 0].T / math.sqrt(32)
    torch.testing.assert_close(torch.diagonal(logits), torch.full((8,), 6.0, dtype=torch.float64))


def test_many_features_estimate_a_soft_lookup_and_the_default_does_not_reach_a_sharp_one():
    soft, sharp = 0, lookup_weight.GAPS.index(8)
    exact = lookup_weight.match_weights(None, 2, 64, 32).median(dim=1).values
    many = lookup_weight.match_weights("performer:n_features=4096", 2, 64, 32)
    default = lookup_weight.match_weights("performer", 2, 64, 32)
    assert many[soft].median().item() == pytest.approx(exact[soft].item(), rel=0.1)
    assert exact[sharp] > 0.9 and default[sharp].median() < 0.5 * exact[sharp]


def test_a_row_names_a_variant_and_its_options():
    assert lookup_weight.parse_row("performer:n_features=2048;eps=0.0") == (
        "performer",
        {"n_features": 2048, "eps": 0.0},
    )
    with pytest.raises(ValueError, match="--rows: 'eps' in 'performer:eps' must be key=value"):
        lookup_weight.parse_row("performer:eps")
