"""The approximation-error section (analysis.approximation_error): the knob table (does each
variant's error fall as its knob gets finer) and the knob figure."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import approximation_error, figures, load
from tests.analysis.conftest import synthetic_records


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_error_by_knob_says_whether_the_error_falls_as_the_approximation_gets_finer():
    rows = []
    for knob, values, errors, attention in (
        ("attention.n_hashes", (1, 2, 4), (0.4, 0.3, 0.2), "lsh"),
        ("attention.block_size", (32, 64, 128), (0.3, 0.35, 0.2), "blockwise"),
        ("attention.factor", (2, 4, 8), (0.1, 0.2, 0.3), "compressed"),
        # 1.12 -> 1.09 -> 1.10: under 5 % from end to end, no step over 5 %: flat, not "falls".
        ("attention.n_features", (64, 128, 256), (1.12, 1.09, 1.10), "performer"),
    ):
        for value, error in zip(values, errors, strict=True):
            rows.append(
                {
                    "status": "ok",
                    "attention": attention,
                    "task": "random_lm",
                    "seq_len": 1024,
                    knob: value,
                    "approx_rel_error": error,
                    "approx_reference_digest": "abc123",
                }
            )
    rows.append({**rows[0], "seq_len": 256, "approx_rel_error": 9.0})  # shorter: not read
    table = approximation_error.error_by_knob(load.tidy(pd.DataFrame(rows)))
    verdict = dict(zip(table.frame["variant"], table.frame["falls"], strict=True))
    assert verdict == {"lsh": "yes", "blockwise": "NO", "compressed": "yes", "performer": "flat"}
    (lsh,) = table.frame[table.frame["variant"] == "lsh"]["finer →"]
    assert lsh == "n_hashes=1: 0.4 → n_hashes=2: 0.3 → n_hashes=4: 0.2"
    (compressed,) = table.frame[table.frame["variant"] == "compressed"]["finer →"]
    assert compressed.startswith("factor=8: 0.3")  # the coarsest first


def test_error_vs_knob_is_left_out_when_no_knob_was_swept(frame):
    assert "no variant's option was swept" in figures.nothing_drawn(
        approximation_error.error_vs_knob(frame)
    )
    swept = frame.assign(**{"attention.n_hashes": frame["seed"] + 1})  # 1 and 2 hashes
    assert figures.nothing_drawn(approximation_error.error_vs_knob(swept)) is None
