"""The MAD and ListOps tables (analysis/suites.py) and their published checks, from records."""

from __future__ import annotations

import pandas as pd

from analysis import load, published, report, series, suites

KINDS = list(suites.MAD_COLUMNS.values())  # compression, fuzzy, in-context, memo, noisy, copy
LENGTHS = {"compression": 32, "memorization": 32}


def mad_sweep(scores: dict[str, list[float]], *, worse: float = 0.2) -> pd.DataFrame:
    """A MAD grid: per variant and kind two grid points (lr 1e-3 wd 0, lr 3e-3 wd 0.1), the
    second `scores` (the chosen one: better on validation), the first `worse` below it."""
    rows = []
    for attention, values in scores.items():
        for kind, value in zip(KINDS, values, strict=True):
            for rate, decay, score in ((1e-3, 0.0, value - worse), (3e-3, 0.1, value)):
                rows.append(
                    {
                        "sweep": "mad",
                        "job": str(len(rows)),
                        "status": "ok",
                        "attention": attention,
                        "task": "mad",
                        "task.kind": kind,
                        "task.vocab_size": 256 if kind == "memorization" else 16,
                        "seq_len": LENGTHS.get(kind, 64),
                        "train.steps": 400,
                        "train.lr": rate,
                        "train.weight_decay": decay,
                        "train.stop_accuracy": 0.99,
                        "train.patience": 4,
                        "seed": 0,
                        "valid_accuracy": score,
                        "eval_accuracy": score,
                        "trained_steps": 400,
                        "learned": score >= 0.9,
                        "chance_accuracy": 1 / 8,
                        "floor_accuracy": 0.3 if "recall" in kind else 0.15,
                    }
                )
    return load.tidy(pd.DataFrame(rows))


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


def test_the_mad_claims_read_the_table():
    verdicts = _verdicts(mad_sweep({"full": EXACT, "deltanet": DELTA}))
    assert verdicts == {
        "attention solves": "holds",
        "delta rule recalls": "holds",
        "memorizes": "not comparable",  # both at the ceiling of vocabulary 256
        "average": "does not hold",  # 82.0 vs 82.2
    }
    weak = [0.30, 0.40, 0.60, 0.99, 0.95, 0.98]  # exact attention below the paper in-context
    verdicts = _verdicts(mad_sweep({"full": weak, "deltanet": [0.2, 0.3, 0.5, 0.6, 0.9, 0.9]}))
    assert verdicts["attention solves"] == "does not hold"
    assert verdicts["delta rule recalls"] == "not comparable"  # exact did not learn in-context
    assert verdicts["memorizes"] == "holds" and verdicts["average"] == "holds"


def _verdicts(frame: pd.DataFrame) -> dict[str, str]:
    table = published.published(frame)
    short = {
        "attention solves": "MAD: attention solves",
        "delta rule recalls": "MAD: the delta rule recalls",
        "memorizes": "MAD: attention memorizes",
        "average": "MAD: attention's average",
        "no variant beats": "ListOps: no efficient",
        "kernel and local fall": "ListOps: kernel and local",
    }
    rows = dict(zip(table.frame["published result"], table.frame["verdict"], strict=True))
    return {
        key: verdict
        for key, start in short.items()
        for result, verdict in rows.items()
        if result.startswith(start)
    }


def listops_sweep(scores: dict[str, float], seeds=(0,)) -> pd.DataFrame:
    rows = []
    for attention, value in scores.items():
        for seed in seeds:
            rows.append(
                {
                    "sweep": "listops",
                    "job": str(len(rows)),
                    "status": "ok",
                    "attention": attention,
                    "task": "listops",
                    "seq_len": 128,
                    "train.lr": 3e-3,
                    "train.steps": 1500,
                    "seed": seed,
                    "valid_accuracy": value,
                    "eval_accuracy": value + 0.01 * seed,
                    "eval_accuracy_ci_low": value - 0.04,
                    "eval_accuracy_ci_high": value + 0.04,
                    "trained_steps": 1500,
                    "learned": False,
                    "chance_accuracy": 0.1,
                    "floor_accuracy": 0.16,
                }
            )
    return load.tidy(pd.DataFrame(rows))


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


def test_the_listops_claims_read_the_table():
    agreeing = {"full": 0.62, "lsh": 0.63, "performer": 0.3, "linear": 0.35, "blockwise": 0.4}
    assert _verdicts(listops_sweep(agreeing)) == {
        "no variant beats": "holds",
        "kernel and local fall": "holds",
    }
    contradicting = {**agreeing, "lsh": 0.7, "linear": 0.6}
    assert _verdicts(listops_sweep(contradicting)) == {
        "no variant beats": "does not hold",
        "kernel and local fall": "does not hold",
    }
    at_floor = {"full": 0.2, "performer": 0.18}
    assert _verdicts(listops_sweep(at_floor))["kernel and local fall"] == "not comparable"
