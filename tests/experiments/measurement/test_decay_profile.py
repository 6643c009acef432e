"""experiments.measurement.decay_profile: what is kept of a pair's write when its key is asked."""

from __future__ import annotations

import pytest
import torch

from experiments.measurement import decay_profile
from experiments.training.tasks import Batch


def test_kept_at_the_query_is_the_product_of_the_decays_after_the_value():
    # key 3 at 0, its value at 1; queried at 5: alpha at positions 2..5 multiply.
    inputs = torch.tensor([[3, 9, 0, 0, 0, 3]])
    batch = Batch(inputs, inputs, torch.tensor([[False] * 5 + [True]]))
    alpha = torch.tensor([0.1, 0.2, 0.5, 0.5, 0.5, 0.5]).expand(1, 1, 2, 6)  # (layers, B, H, L)
    kept = decay_profile.kept_at_queries(alpha, batch)
    assert kept.tolist() == pytest.approx([0.5**4] * 2)


def test_the_table_has_a_row_per_variant_and_decay_and_the_papers(capsys):
    assert decay_profile.main(["--models", "1", "--seq-len", "64"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| gated_deltanet, gate",
        "| gated_deltanet, mamba",
        "| mamba2, gate",
        "| mamba2, mamba",
        "| paper's init, x W = 0",
    ]
    medians = {r.split(" | ")[0][2:]: float(r.split(" | ")[3]) for r in rows}
    assert medians["gated_deltanet, gate"] < 0.6 < 0.85 < medians["gated_deltanet, mamba"]
