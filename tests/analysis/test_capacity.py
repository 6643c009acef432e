"""Capacity from a mixture-trained sweep: one job per variant and head dim, its own record at
the smallest count and one evaluation point per other count (`<job>/n_pairs=P`)."""

from __future__ import annotations

import pandas as pd

from analysis import capacity, headline
from tests.analysis.suite_records import CAPACITY_PAIRS, capacity_sweep

PAIRS = CAPACITY_PAIRS
# Accuracy per count: exact holds every count, linear falls past 16 pairs, deltanet past 32,
# performer learns nothing (its control, 4 pairs, at 30 %).
ACCURACY = {
    "full": (1.0, 1.0, 0.99, 0.99, 0.98),
    "linear": (0.99, 0.97, 0.92, 0.6, 0.3),
    "deltanet": (1.0, 0.99, 0.97, 0.95, 0.7),
    "performer": (0.3, 0.2, 0.1, 0.05, 0.02),
}


def _mixture_sweep() -> pd.DataFrame:
    # The run's learned: its control (4 pairs) reached 90 % during training.
    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    return capacity_sweep(
        (a, v, {**shape, "steps_to_learn": 250 if v[0] >= 0.9 else None})
        for a, v in ACCURACY.items()
    )


def test_points_of_one_job_give_each_variant_its_capacity():
    table = capacity.capacity(_mixture_sweep())
    rows = {r["variant"]: r["head dim 16"] for r in table.frame.to_dict("records")}
    assert rows["linear"] == "16" and rows["deltanet"] == "32"
    # Not learned, with its control read at the smallest count (not a mean over the counts).
    assert rows["performer"] == "not learned in 400 steps (control 30.0%)"
    assert "reached ≥ 95 % at every point" in table.note


def test_the_accuracy_table_says_one_model_per_variant_trained_on_the_mixture():
    table = capacity.accuracy_by_pairs(_mixture_sweep())
    rows = {r["variant"]: r for r in table.frame.to_dict("records")}
    assert list(rows["linear"])[2:] == [f"{p} pairs" for p in PAIRS]
    assert rows["linear"]["64 pairs"] == "30.0" and rows["full"]["4 pairs"] == "100.0"
    assert "one model, trained on sequences whose number of pairs is drawn from [4, 8" in table.note


def test_exact_attention_below_ninety_five_at_one_count_is_a_warning():
    frame = _mixture_sweep()
    frame.loc[(frame["attention"] == "full") & (frame["task.n_pairs"] == 64), "eval_accuracy"] = 0.5
    assert "WARNING: exact attention stayed below 95 % at 64 pairs" in capacity.capacity(frame).note


def test_the_headline_of_a_capacity_sweep_gives_each_variant_its_capacity_once():
    """One bullet per efficient variant with the capacity table's cells, never an accuracy
    difference averaged over the numbers of pairs (nor one bullet per number of pairs)."""
    bullets = [line for line in headline.headline(_mixture_sweep()) if line.startswith("- ")]
    assert sorted(bullets) == [
        "- **deltanet**: recall capacity (pairs within 10 points of exact attention): "
        "32 at head dim 16.",
        "- **linear**: recall capacity (pairs within 10 points of exact attention): "
        "16 at head dim 16.",
        "- **performer**: recall capacity (pairs within 10 points of exact attention): "
        "not learned in 400 steps (control 30.0%) at head dim 16.",
    ]


def test_a_hybrid_stack_is_its_own_row_not_exact_attentions():
    """A stack's records say `attention` full (its full layers'); capacity reads them under the
    stack's name, so exact attention's row and the reference stay the all-full model's."""
    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    frame = capacity_sweep(
        [
            ("full", ACCURACY["full"], {**shape, "layers": "full"}),
            ("full", (0.6, 0.5, 0.4, 0.3, 0.2), {**shape, "layers": "mamba2+full"}),
        ]
    )
    rows = {r["variant"]: r for r in capacity.accuracy_by_pairs(frame).frame.to_dict("records")}
    assert rows["full"]["4 pairs"] == "100.0" and rows["full"]["64 pairs"] == "98.0"
    assert rows["mamba2+full (not learned)"]["4 pairs"] == "60.0"
    cells = capacity.capacity(frame).frame.set_index("variant")["head dim 16"]
    assert cells["mamba2+full"].startswith("not learned")


def test_models_of_another_depth_are_their_own_rows_read_against_exact_attention_there():
    """Depth 4 beside the preset's depth 2 (capacity's 3 : 1 stacks and their references): not
    averaged into the depth-2 rows; each read against exact attention of its own depth."""
    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    deep_full = (1.0, 1.0, 0.99, 0.8, 0.6)
    frame = capacity_sweep(
        [
            *((a, ACCURACY[a], {**shape, "depth": 2}) for a in ("full", "deltanet", "linear")),
            ("full", deep_full, {**shape, "depth": 4}),
            ("deltanet", (1.0, 0.99, 0.97, 0.75, 0.55), {**shape, "depth": 4}),
        ]
    )
    rows = {r["variant"]: r for r in capacity.accuracy_by_pairs(frame).frame.to_dict("records")}
    assert rows["full"]["64 pairs"] == "98.0" and rows["full (depth 4)"]["64 pairs"] == "60.0"
    cells = capacity.capacity(frame).frame.set_index("variant")["head dim 16"]
    # Within 10 points of depth 4's exact attention at every count; of depth 2's only to 16.
    assert cells["deltanet (depth 4)"] == "≥ 64" and cells["deltanet"] == "32"
    assert "full (depth 4)" not in cells  # exact attention is the reference, not a row


def test_two_settings_of_a_variants_option_are_two_rows():
    """A window swept on capacity: each window its own row, not their mean under one name."""
    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    frame = capacity_sweep(
        [
            ("full", ACCURACY["full"], shape),
            ("sliding_window", (1.0, 0.9, 0.6, 0.4, 0.2), {**shape, "attention.window": 64}),
            ("sliding_window", ACCURACY["full"], {**shape, "attention.window": 256}),
        ]
    )
    cells = capacity.capacity(frame).frame.set_index("variant")["head dim 16"]
    assert cells["sliding_window window=256"] == "≥ 64" and cells["sliding_window window=64"] == "8"


def test_a_model_of_another_width_is_its_own_row():
    """Head dim 16 at d_model 32 (2 heads) beside the preset's d_model 64 (4 heads): its own
    row, named by its width, not averaged into the preset's head dim 16."""
    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    narrow = {**shape, "d_model": 32, "n_heads": 2}
    frame = capacity_sweep(
        [
            ("full", ACCURACY["full"], shape),
            ("linear", ACCURACY["linear"], shape),
            ("full", ACCURACY["full"], {**shape, "seed": 1}),
            ("linear", ACCURACY["performer"], narrow),
        ]
    )
    cells = capacity.capacity(frame).frame.set_index("variant")["head dim 16"]
    assert cells["linear"] == "16"
    assert cells["linear (d_model 32)"].startswith("not learned")
