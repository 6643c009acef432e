"""The quality-after-training table."""

import pandas as pd

from analysis import load, trained_quality


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
    table = trained_quality.quality(frame)
    rows = table.frame.to_dict("records")
    assert [(r["variant"], r["shared_qk"]) for r in rows] == [("full", "False"), ("full", "True")]
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
    rows = trained_quality.quality(frame).frame.to_dict("records")
    assert [r["configuration"] for r in rows] == ["full", "lsh-4"]
    assert rows[1]["eval accuracy (%)"] == "75.0"
    assert rows[1]["Δ eval accuracy (%) vs full"] == "-25.0 %"


def test_cost_only_sweeps_have_no_quality_table():
    frame = _records({"task": "random_lm", "eval_loss": 5.5, "step_ms": 3.0})
    assert trained_quality.quality(frame) is None
    assert trained_quality.quality(_records({"step_ms": 3.0})) is None  # nothing trained


def test_a_learning_rate_grid_shows_each_variants_chosen_rate_only():
    """The row is the rate lowest in held-out loss (`valid_loss`), not the mean of the grid and
    not the rate best in the reported bits/byte."""
    grid = [
        ("full", 1e-3, 1.90, 2.75), ("full", 3e-3, 1.97, 2.60),
        ("linear", 1e-3, 2.40, 3.45), ("linear", 3e-3, 2.35, 3.50),
    ]  # fmt: skip
    frame = _records(
        *(
            {"attention": a, "seed": 0, "train.lr": lr, "valid_loss": v, "eval_bits_per_byte": e}
            for a, lr, v, e in grid
        )
    )
    rows = trained_quality.quality(frame).frame.to_dict("records")
    assert [(r["variant"], r["eval bits/byte"], r["seeds"]) for r in rows] == [
        ("full", "2.7500", 1), ("linear", "3.5000", 1),
    ]  # fmt: skip
    assert rows[0]["lr (grid)"] == "0.001 of {0.001, 0.003}"
    assert rows[1]["lr (grid)"] == "0.003 of {0.001, 0.003}"


def test_the_command_prints_the_table_of_a_results_file(tmp_path, capsys):
    rows = [
        {"seed": 0, "eval_bits_per_byte": 2.0, "step_ms": 10.0},
        {"seed": 0, "attention": "linear", "eval_bits_per_byte": 2.5, "step_ms": 5.0},
    ]
    frame = _records(*rows)
    path = tmp_path / "results.csv"
    frame.to_csv(path, index=False)
    trained_quality.main([str(path)])
    assert trained_quality.quality(frame).markdown() in capsys.readouterr().out
