"""The MAD and ListOps tables (analysis/suites.py), read from records."""

from __future__ import annotations

from analysis import report, series, suites
from tests.analysis.suite_records import listops_sweep, mad_sweep

#           compression fuzzy in-context memorize noisy copy
EXACT = [0.30, 0.65, 1.00, 0.99, 1.00, 0.98]
DELTA = [0.25, 0.70, 1.00, 0.99, 1.00, 0.99]


def test_the_mad_table_reads_each_variants_chosen_point_per_task_in_the_papers_order():
    table = suites.mad_table(mad_sweep({"full": EXACT, "deltanet": DELTA}))
    frame = table.frame.set_index("variant")
    assert list(table.frame.columns[:8]) == [
        "variant",
        "Compress",
        "Fuzzy",
        "In-context",
        "Memorize",
        "Noisy",
        "Selective copy",
        "avg",
    ]
    assert list(frame.loc["full", ["Compress", "In-context", "avg"]]) == ["30.0 †", "100.0", "82.0"]
    assert frame.loc["deltanet", "Fuzzy"] == "70.0 †"  # never reached 90 %: not learned
    assert frame.loc["chance", "In-context"] == "12.5" and frame.loc["floor", "Noisy"] == "30.0"
    assert list(frame.loc["Transformer (published)"])[:7] == [
        "51.6",
        "29.8",
        "94.1",
        "85.2",
        "86.8",
        "99.6",
        "74.5",
    ]
    assert frame.loc["DeltaNet (published)", "avg"] == "71.8"
    assert "lr and weight decay per variant from {0.001, 0.003} × wd {0, 0.1}" in table.note
    assert "Compress L=32 V=16 cap 400" in table.note


def test_a_task_not_trained_leaves_its_cell_and_the_average_empty():
    sweep = mad_sweep({"full": EXACT})
    sweep = sweep[sweep["task.kind"] != "memorization"]
    frame = suites.mad_table(sweep).frame.set_index("variant")
    assert frame.loc["full", "Memorize"] == "—" and frame.loc["full", "avg"] == "—"


def test_mad_records_stay_out_of_the_general_quality_tables():
    """Their lengths differ by task: no length axis, no series (their own table reads them)."""
    sweep = mad_sweep({"full": EXACT})
    assert series.trained_quality(sweep).empty
    assert len(series.trained_quality(sweep, suites=True)) == 6
    text = report.markdown_tables(sweep)
    assert (
        "## MAD: six synthetic tasks" in text and "Trained quality vs sequence length" not in text
    )


def test_the_listops_table_sets_each_variant_beside_its_lra_model():
    table = suites.listops_table(
        listops_sweep({"full": 0.62, "lsh": 0.6, "performer": 0.3, "deltanet": 0.55})
    )
    frame = table.frame
    by_variant = frame.set_index("variant")
    assert list(frame["variant"][:4]) == ["full", "deltanet", "lsh", "performer"]
    assert by_variant.loc["full", "ListOps accuracy (%)"] == "62.0 [58.0–66.0]"
    assert by_variant.loc["lsh", "LRA model"] == "Reformer"
    assert by_variant.loc["lsh", "LRA ListOps (%)"] == "37.27"
    assert by_variant.loc["deltanet", "LRA ListOps (%)"] == "—"  # no LRA counterpart
    assert by_variant.loc["floor", "ListOps accuracy (%)"] == "16.0"
    unmatched = frame[frame["variant"] == "—"]
    assert "Synthesizer" in set(unmatched["LRA model"]) and "Reformer" not in set(
        unmatched["LRA model"]
    )
    two = suites.listops_table(listops_sweep({"full": 0.62}, seeds=(0, 1))).frame
    assert two.set_index("variant").loc["full", "ListOps accuracy (%)"] == "62.5 (62.0–63.0)"
