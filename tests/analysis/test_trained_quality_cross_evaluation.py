"""The trained-with x evaluated-with table (Reformer Table 2's layout)."""

import pandas as pd

from analysis import trained_quality


def test_rows_are_training_kernels_and_columns_evaluation_kernels():
    frame = pd.DataFrame(
        [
            {
                "status": "ok",
                "train_as": "full",
                "attention": "lsh",
                "eval_accuracy@full": 1.0,
                "eval_accuracy@lsh-1": 0.5,
            },
            {
                "status": "ok",
                "train_as": "lsh-4",
                "attention": "lsh",
                "eval_accuracy@full": 0.9,
                "eval_accuracy@lsh-1": 0.8,
            },
            {
                "status": "ok",
                "train_as": "lsh-4",
                "attention": "lsh",
                "eval_accuracy@full": 0.7,
                "eval_accuracy@lsh-1": 0.6,
            },
            {
                "status": "error",
                "train_as": "lsh-2",
                "attention": "lsh",
                "eval_accuracy@full": None,
                "eval_accuracy@lsh-1": None,
            },
        ]
    )
    table = trained_quality.cross_evaluation(frame)
    assert list(table.frame.columns) == ["trained with", "eval full", "eval lsh-1"]
    assert table.frame.values.tolist() == [["full", 100.0, 50.0], ["lsh-4", 80.0, 70.0]]
    assert "| lsh-4 | 80" in table.markdown()


def test_no_cross_evaluation_columns_no_table():
    assert (
        trained_quality.cross_evaluation(pd.DataFrame([{"status": "ok", "attention": "full"}]))
        is None
    )
