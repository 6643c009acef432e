"""Per-series fits (analysis.scaling_fits) on synthetic results with known exponents and
crossover."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import load, scaling_fits, series
from tests.analysis.conftest import synthetic_records


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_scaling_fits_recover_exponents_and_crossover(frame):
    labelled, keys = series.with_series(frame, x="seq_len")
    fits = scaling_fits.scaling_fits(labelled, keys, "attn_fwd_bwd_ms")
    assert fits["full"].power_law.exponent == pytest.approx(2.0, abs=1e-9)
    assert fits["lsh"].power_law.exponent == pytest.approx(1.0, abs=1e-9)
    assert fits["full"].crossover is None  # the reference itself
    assert fits["lsh"].crossover.kind == "crossed"
    assert fits["lsh"].crossover.length == pytest.approx(1000.0, rel=1e-6)
