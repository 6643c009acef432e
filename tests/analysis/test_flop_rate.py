"""The FLOP-rate section (analysis.flop_rate): achieved FLOP/s as a fraction of the matmul rate."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import flop_rate, load
from tests.analysis.conftest import synthetic_records, texts


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_a_flagged_flop_fraction_is_drawn_hollow(frame):
    flagged = frame.assign(
        matmul_peak_gflops_per_s=100.0,
        attn_fwd_gflops_per_s=50.0,
        attn_fwd_bwd_gflops_per_s=50.0,
        attn_fwd_bwd_matmul_fraction=0.5,
        matmul_fraction_warning=False,
    )
    at = (flagged["attention"] == "lsh") & (flagged["seq_len"] == 1024)
    flagged.loc[at, ["attn_fwd_bwd_matmul_fraction", "matmul_fraction_warning"]] = [1.4, True]
    figure = flop_rate.flops_fraction(flagged)
    hollow = [
        line
        for line in figure.axes[1].get_lines()
        if line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))
    ]
    assert len(hollow) == 1  # lsh's two seeds at 1024, nothing else
    assert set(hollow[0].get_xdata()) == {1024} and set(hollow[0].get_ydata()) == {1.4}
    assert any(t.startswith("hollow: above 1.05") for t in texts(figure))
