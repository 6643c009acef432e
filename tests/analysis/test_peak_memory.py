"""The peak-memory section (analysis.peak_memory): memory against sequence length and depth."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import load, peak_memory
from tests.analysis.conftest import synthetic_records


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_seeds_are_drawn_as_a_band(frame):
    figure = peak_memory.memory_vs_seq_len(
        frame.assign(peak_memory_bytes=frame["peak_memory_bytes"] * (1 + 0.1 * frame["seed"]))
    )
    assert figure.axes[0].collections  # fill_between bands
