"""Which records share a series: only identical configurations (every resolved key) do."""

from __future__ import annotations

import pandas as pd

from analysis import kernel_time, load, scaling_fits, series


def records(**varying) -> pd.DataFrame:
    """Two seeds of full attention at two lengths, for each combination given in `varying`."""
    base = {
        "status": "ok",
        "attention": "full",
        "block": "residual",
        "task": "random_lm",
        "device": "cpu",
        "threads": 2,
        "measure.min_run_time_s": 0.3,
        "timestamp": "2026-01-01T00:00:00",
    }
    rows = []
    combinations = zip(*varying.values(), strict=True)
    for extra in [dict(zip(varying, values, strict=True)) for values in combinations]:
        for seed in (0, 1):
            for length in (256, 512):
                cost = length / 100 * (1 + seed / 10)
                rows.append({**base, **extra, "seed": seed, "seq_len": length, "attn_fwd_ms": cost})
                rows[-1]["attn_fwd_bwd_ms"] = 3 * cost
    return load.tidy(pd.DataFrame(rows))


def test_configurations_that_differ_only_in_threads_are_not_averaged():
    # A joblib sweep at threads=1, re-run with the basic launcher at threads=2.
    frame = records(threads=[1, 2], **{"train.steps": [3, 3]})
    labelled, keys = series.with_series(frame, x="seq_len")
    assert keys == ["variant", "threads"]
    assert sorted(labelled["series"].unique()) == ["full threads=1", "full threads=2"]
    table = kernel_time.variant_summary(frame).frame
    assert list(table[["variant", "threads"]].itertuples(index=False, name=None)) == [
        ("full", "1"),
        ("full", "2"),
    ]


def test_seeds_and_how_long_the_clock_ran_are_spread_not_series():
    frame = records(**{"measure.min_run_time_s": [0.05, 0.3]})
    labelled, keys = series.with_series(frame, x="seq_len")
    assert keys == ["variant"] and set(labelled["series"]) == {"full"}
    assert series.mean_spread(labelled, "seq_len", "attn_fwd_ms")["n"].tolist() == [4, 4]


def test_every_resolved_key_that_varies_sets_series_apart():
    frame = records(**{"train.steps": [3, 30], "model.ff_chunks": [1, 4]})
    _, keys = series.with_series(frame, x="seq_len")
    assert keys[0] == "variant" and set(keys[1:]) == {"model.ff_chunks", "train.steps"}
    described = series.key_values(*series.with_series(frame, x="seq_len"))
    assert set(described.columns) == {"variant", "ff_chunks", "steps"} and len(described) == 2


def test_a_pinned_fused_sdpa_backend_is_the_reference_where_plain_sdpa_was_not_measured():
    # Exact attention measured as impl=sdpa_flash and impl=math only, beside a variant.
    frame = records(**{"attention.impl": ["sdpa_flash", "math", None]})
    frame.loc[frame["attention.impl"].isna(), "attention"] = "linear"
    labelled, keys = series.with_series(load.tidy(frame), x="seq_len")
    assert series.reference_of(labelled, keys) == {
        "full impl=math": "full impl=sdpa_flash",
        "linear": "full impl=sdpa_flash",
    }
    assert series.reference_of(labelled, keys, series.QUADRATIC)["linear"] == "full impl=math"


def test_a_pinned_fused_backend_is_the_fused_baseline_itself_and_sdpa_math_is_not():

    frame = records(**{"attention.impl": ["sdpa_flash", "sdpa_math"]})
    labelled, _ = series.with_series(frame, x="seq_len")
    assert scaling_fits._is_baseline(labelled, "full impl=sdpa_flash", series.FUSED)
    assert not scaling_fits._is_baseline(labelled, "full impl=sdpa_math", series.FUSED)
    assert not scaling_fits._is_baseline(labelled, "full impl=sdpa_flash", series.QUADRATIC)
