"""The report's headline: per variant, crossover, kernel memory saving and accuracy cost."""

import pandas as pd

from analysis import headline, load, report
from experiments.records.record import MIB

LENGTHS = (256, 1024, 4096)


def _records(*rows):
    base = {
        "status": "ok",
        "task": "random_lm",
        "block": "residual",
        "seed": 0,
        "model.causal": True,
        "model.shared_qk": False,
    }
    return load.tidy(pd.DataFrame([{**base, **row} for row in rows]))


def _cost():
    """Exact attention (SDPA) 1e-4·L² ms, its O(L²) form twice that and out of memory at 4096;
    blockwise 0.1·L ms (crosses SDPA at 1000). Kernel memory: SDPA 1 KiB·L, O(L²) 16 B·L²,
    blockwise 2 KiB·L."""
    rows = []
    for L in LENGTHS:
        rows += [
            {
                "attention": "full",
                "attention.impl": "sdpa",
                "seq_len": L,
                "attn_fwd_bwd_ms": 1e-4 * L**2,
                "attn_fwd_bwd_peak_bytes": 1024 * L,
            },
            {
                "attention": "blockwise",
                "seq_len": L,
                "attn_fwd_bwd_ms": 0.1 * L,
                "attn_fwd_bwd_peak_bytes": 2048 * L,
            },
        ]
        rows.append(
            {"attention": "full", "attention.impl": "math", "seq_len": L, "status": "oom"}
            if L == 4096
            else {
                "attention": "full",
                "attention.impl": "math",
                "seq_len": L,
                "attn_fwd_bwd_ms": 2e-4 * L**2,
                "attn_fwd_bwd_peak_bytes": 16 * L**2,
            }
        )
    return _records(*rows)


def _quality(exact_at_1024=1.0):
    rows = [
        {
            "attention": a,
            "task": "long_recall",
            "seq_len": L,
            "eval_accuracy": acc,
            "trained_steps": 400 + L // 4,
        }
        for a, L, acc in (
            ("full", 256, 1.0),
            ("full", 1024, exact_at_1024),
            ("blockwise", 256, 0.98),
            ("blockwise", 1024, 0.25),
        )
    ]
    return _records(*rows)


def test_each_variant_gets_its_crossovers_memory_factors_and_accuracy_cost():
    lines = headline.headline(_cost(), _quality())
    assert lines[0] == "## Headline"
    (bullet,) = [line for line in lines if line.startswith("- ")]  # exact attention has none
    assert bullet.startswith("- **blockwise**: faster than SDPA from L≈1,000")
    assert "faster than O(L²) attention from L≈500" in bullet  # 2e-4·L² = 0.1·L
    kernel = 2048 * 4096 / MIB
    assert f"kernel memory {kernel:,.1f} MiB at L=4,096: 2.0× more than SDPA" in bullet
    # O(L²) stopped at 1024 (oom at 4096): the factor is where both were measured, and says so.
    assert f"{16 * 1024 / 2048:,.1f}× less than O(L²) (at 1,024)" in bullet
    # A reduced run says how long it trained (slow learners are not yet where they end up).
    assert (
        "long_recall accuracy after 656 steps 25.0% vs exact 100.0% at L=1,024 (−75.0 points)"
        in bullet
    )


def test_accuracy_is_read_only_where_exact_attention_reached_the_ceiling():
    lines = headline.headline(_cost(), _quality(exact_at_1024=0.5))
    (bullet,) = [line for line in lines if line.startswith("- ")]
    assert "at L=256 (−2.0 points)" in bullet and "1,024 (" not in bullet


def test_nothing_measured_says_nothing():
    frame = _records({"attention": "full", "seq_len": 256, "attn_fwd_bwd_ms": 1.0})
    assert headline.headline(frame) == []


def test_the_report_opens_with_the_headline_and_takes_quality_from_the_other_frame():
    text = report.markdown(_cost(), quality=_quality())
    assert text.index("## Headline") < text.index("## Per variant")
    assert "Trained quality vs sequence length" in text  # tables from the quality frame
    assert "### accuracy_vs_seq_len" in text  # and its figures
    alone = report.markdown(_cost())
    assert "Trained quality" not in alone and "### accuracy_vs_seq_len" not in alone


def _with_speedups(speedups, spreads):
    """_cost(), blockwise's records carrying in-job speed-ups over SDPA that disagree with the
    times of exact attention's own jobs (those would cross at 1000)."""
    frame = _cost()
    rows = (frame["attention"] == "blockwise").to_numpy()
    for column, values in (("speedup_vs_sdpa", speedups), ("speedup_vs_sdpa_iqr", spreads)):
        frame[column] = float("nan")
        frame.loc[rows, column] = [values[L] for L in frame.loc[rows, "seq_len"]]
    return frame


def test_the_crossover_comes_from_the_in_job_speedups():
    # Slower at 256 and 1024 (0.512, 0.8), faster at 4096 (1.25): a power law in L (x1.5625
    # per quadrupling) that crosses 1 halfway between 1024 and 4096 in log L, at 2048.
    frame = _with_speedups({256: 0.512, 1024: 0.8, 4096: 1.25}, {256: 0.1, 1024: 0.1, 4096: 0.1})
    (bullet,) = [line for line in headline.headline(frame) if line.startswith("- ")]
    assert bullet.startswith("- **blockwise**: faster than SDPA from L≈2,048,")
    assert "uncertain" not in bullet
    assert "| 2,048 |" in report.markdown(frame)  # the per-variant table agrees


def test_a_spread_wider_than_the_distance_to_one_makes_the_crossover_uncertain():
    frame = _with_speedups({256: 0.512, 1024: 0.8, 4096: 1.25}, {256: 0.1, 1024: 0.3, 4096: 0.1})
    (bullet,) = [line for line in headline.headline(frame) if line.startswith("- ")]
    assert "faster than SDPA from L≈2,048 (uncertain: timing spread)" in bullet
    # A spread far from the crossing does not matter.
    frame = _with_speedups({256: 0.512, 1024: 0.8, 4096: 1.25}, {256: 0.9, 1024: 0.1, 4096: 0.1})
    (bullet,) = [line for line in headline.headline(frame) if line.startswith("- ")]
    assert "uncertain" not in bullet
