"""The quality-after-training table, and the per-variant table's crossover column."""

import pandas as pd

from analysis import load, tables


def _records(*rows):
    base = {
        "status": "ok",
        "attention": "full",
        "task": "text",
        "block": "residual",
        "seq_len": 128,
        "model.shared_qk": False,
    }
    return load.tidy(pd.DataFrame([{**base, **row} for row in rows]))


def test_rows_per_configuration_with_mean_over_seeds_and_difference_from_the_first():
    frame = _records(
        {"seed": 0, "eval_bits_per_byte": 2.0, "step_ms": 10.0, "peak_memory_bytes": 2**20},
        {"seed": 1, "eval_bits_per_byte": 2.2, "step_ms": 12.0, "peak_memory_bytes": 2**20},
        {"seed": 0, "model.shared_qk": True, "eval_bits_per_byte": 2.31},
        {"seed": 0, "model.shared_qk": True, "status": "error", "eval_bits_per_byte": None},
    )
    table = tables.quality(frame)
    rows = table.frame.to_dict("records")
    assert [r["configuration"] for r in rows] == ["full shared_qk=False", "full shared_qk=True"]
    assert [r["seeds"] for r in rows] == [2, 1]
    assert rows[0]["eval bits/byte"] == "2.1000" and rows[1]["eval bits/byte"] == "2.3100"
    delta = "Δ eval bits/byte vs full shared_qk=False"
    assert rows[0][delta] == "—" and rows[1][delta] == "+10.0 %"  # 2.31 / 2.1 - 1
    assert rows[0]["step (ms)"] == "11.0" and rows[1]["step (ms)"] == ""
    assert rows[0]["peak memory (MiB)"] == "1.0"


def test_accuracy_rows_named_by_the_presets_train_as():
    frame = _records(
        {"train_as": "full", "task": "duplication", "eval_accuracy": 1.0, "eval_loss": 0.1},
        {
            "train_as": "lsh-4",
            "attention": "lsh",
            "task": "duplication",
            "eval_accuracy": 0.75,
            "eval_loss": 0.9,
        },
    )
    rows = tables.quality(frame).frame.to_dict("records")
    assert [r["configuration"] for r in rows] == ["full", "lsh-4"]
    assert rows[1]["eval accuracy (%)"] == "75.0"
    assert rows[1]["Δ eval accuracy (%) vs full"] == "-25.0 %"


def test_cost_only_sweeps_have_no_quality_table():
    frame = _records({"task": "random_lm", "eval_loss": 5.5, "step_ms": 3.0})
    assert tables.quality(frame) is None
    assert tables.quality(_records({"step_ms": 3.0})) is None  # nothing trained


def test_a_series_with_no_measurement_has_no_crossover_rather_than_being_the_reference():
    # A skipped job keeps the configured device ("auto"), so no exact series shares its context.
    rows = [
        {
            "status": "ok",
            "attention": "full",
            "task": "random_lm",
            "seq_len": n,
            "device": "cpu",
            "attn_fwd_ms": n / 100,
            "attn_fwd_bwd_ms": n / 50,
        }
        for n in (256, 512)
    ]
    rows += [
        {
            "status": "skipped",
            "attention": "linformer",
            "task": "random_lm",
            "seq_len": n,
            "device": "auto",
            "error": "cannot be causal",
        }
        for n in (256, 512)
    ]
    table = tables.variant_summary(load.tidy(pd.DataFrame(rows))).frame.set_index("variant")
    assert table.loc["full", "L* fwd"] == "reference"
    assert table.loc["linformer", "L* fwd"] == "—"
