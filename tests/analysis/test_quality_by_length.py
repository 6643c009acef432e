"""The long-range quality sections: accuracy vs length, its table and its figure (the records
the quality-cost chart is tested on too)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import load, report, series, trained_quality

LENGTHS = (256, 512, 1024, 2048)
ACCURACY = {  # variant -> accuracy at each length, seed 0; seed 1 is 0.02 lower
    "full": (1.0, 1.0, 0.99, 0.98),
    "blockwise": (1.0, 0.5, 0.2, 0.07),
    "linformer": (0.9, 0.6, 0.3, 0.1),
}


def long_range_records(exact=ACCURACY["full"]) -> pd.DataFrame:
    """A curriculum sweep's records: every stage a record (batch size shrinking with length),
    kernel time and memory only at the last; linformer trained bidirectionally."""
    accuracy = {**ACCURACY, "full": exact}
    rows = []
    for attention, values in accuracy.items():
        for seed, shift in ((0, 0.0), (1, 0.02)):
            for length, value in zip(LENGTHS, values, strict=True):
                last = length == LENGTHS[-1]
                rows.append(
                    {
                        "sweep": "long_range",
                        "config_hash": f"{attention}-{seed}-{length}",
                        "status": "ok",
                        "attention": attention,
                        "task": "long_recall",
                        "task.n_values": 16,
                        "block": "residual",
                        "seq_len": length,
                        "batch_size": 2048 // length,
                        "causal": attention != "linformer",
                        "seed": seed,
                        "eval_accuracy": value - shift,
                        "attn_fwd_bwd_ms": {"full": 20.0, "blockwise": 5.0}.get(attention, 8.0)
                        if last
                        else None,
                        "peak_memory_bytes": 2**20 * (4 if attention == "full" else 2)
                        if last
                        else None,
                    }
                )
    return load.tidy(pd.DataFrame(rows))


def test_the_table_has_a_row_per_variant_and_a_column_per_length():
    table = trained_quality.quality_by_length(long_range_records())
    rows = {r["variant"]: r for r in table.frame.to_dict("records")}
    assert list(rows) == ["full", "blockwise", "linformer (bidirectional)", "chance"]
    lengths = ["L=256", "L=512", "L=1,024", "L=2,048"]
    assert list(table.frame.columns) == ["variant", "seeds", *lengths, "learned"]
    assert rows["full"]["L=2,048"] == "97.0 (96.0–98.0)"
    assert rows["blockwise"]["L=512"] == "49.0 (48.0–50.0)"
    assert rows["full"]["seeds"] == 2
    assert rows["chance"]["L=256"] == "6.2"  # 1 / task.n_values: these records have no floor
    assert "reached ≥ 90% at every length" in table.note


def test_the_note_warns_where_exact_attention_missed_the_ceiling():
    table = trained_quality.quality_by_length(long_range_records(exact=(1.0, 0.95, 0.6, 0.3)))
    assert "WARNING: exact attention stayed below 90% at L=1,024, 2,048" in table.note


def test_single_length_results_have_no_length_table_and_random_tokens_are_not_quality():
    one_length = long_range_records()
    one_length = one_length[one_length["seq_len"] == 2048]
    assert trained_quality.quality_by_length(one_length) is None
    random_tokens = long_range_records().assign(task="random_lm")
    assert trained_quality.quality_by_length(random_tokens) is None
    assert series.trained_quality(random_tokens).empty


def test_the_report_draws_accuracy_and_the_chart_only_for_trained_quality(tmp_path):
    frame = long_range_records()
    assert {"accuracy_vs_seq_len", "tradeoff"} <= set(report.drawn_figures(frame))
    assert isinstance(trained_quality.accuracy_vs_seq_len(frame), Figure)
    random_tokens = frame.assign(task="random_lm", approx_rel_error=None)
    drawn = set(report.drawn_figures(random_tokens))
    assert "accuracy_vs_seq_len" not in drawn and "tradeoff" not in drawn
    text = report.markdown(frame, sources=["x"])
    assert "## Trained quality vs sequence length: accuracy (%)" in text
    assert "![accuracy_vs_seq_len](accuracy_vs_seq_len.png)" in text
