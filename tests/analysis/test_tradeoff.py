"""The trade-off section (analysis.tradeoff): quality against kernel time against memory."""

from __future__ import annotations

import pandas as pd

from analysis import tradeoff
from tests.analysis.test_quality_by_length import long_range_records


def test_the_chart_plots_accuracy_against_kernel_time_at_the_longest_length():
    figure = tradeoff.tradeoff(long_range_records())
    (ax,) = figure.axes
    assert "at seq_len=2048" in figure.texts[0].get_text()
    points = {
        tuple(map(float, offsets))
        for collection in ax.collections
        for offsets in collection.get_offsets()
    }
    assert (20.0, 97.0) in points and (5.0, 6.0) in points  # full, blockwise: mean of seeds
    assert "forward + backward" in ax.get_xlabel() and "accuracy" in ax.get_ylabel()


def test_without_accuracy_the_chart_uses_the_error_on_trained_activations():
    frame = long_range_records().assign(task="random_lm", eval_accuracy=None)
    frame["approx_rel_error"] = frame["attn_fwd_bwd_ms"].map(lambda t: None if pd.isna(t) else 0.1)
    assert tradeoff.tradeoff_quality(frame)[0] == "approx_rel_error"
    (ax,) = tradeoff.tradeoff(frame).axes
    assert "trained activations" in ax.get_ylabel()
