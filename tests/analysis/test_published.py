"""Published results beside ours (analysis/published.py): each verdict read from records."""

from __future__ import annotations

import pandas as pd

from analysis import load, published
from tests.analysis.conftest import synthetic_records
from tests.analysis.suite_records import listops_sweep, mad_sweep


def _capacity(accuracy: dict[str, dict[int, float]]) -> pd.DataFrame:
    """One job per variant at head dim 16, recorded at each number of pairs."""
    rows = []
    for job, (attention, by_pairs) in enumerate(accuracy.items()):
        for pairs, value in by_pairs.items():
            rows.append(
                {
                    "sweep": "capacity",
                    "job": str(job) if pairs == 4 else f"{job}/n_pairs={pairs}",
                    "status": "ok",
                    "attention": attention,
                    "task": "recall",
                    "task.n_pairs": pairs,
                    "seq_len": 256,
                    "d_model": 64,
                    "n_heads": 4,
                    "seed": 0,
                    "eval_accuracy": value,
                    "learned": by_pairs[4] >= 0.9,
                }
            )
    return load.tidy(pd.DataFrame(rows))


def _verdicts(frame: pd.DataFrame) -> dict[str, str]:
    table = published.published(frame)
    return dict(zip(table.frame["published result"], table.frame["verdict"], strict=True))


EXACT = {4: 1.0, 16: 0.99, 64: 0.98}


def test_each_claim_holds_or_not_by_the_numbers(monkeypatch):
    from analysis import coverage

    # without probe records (the snapshot's MoBA row: its own test below)
    monkeypatch.setattr(coverage, "probe_records", lambda frame=None, snapshot=None: pd.DataFrame())
    agreeing = _capacity(
        {
            "full": EXACT,
            "linear": {4: 0.98, 16: 0.7, 64: 0.3},
            "deltanet": {4: 1.0, 16: 0.9, 64: 0.5},
        }
    )
    verdicts = _verdicts(agreeing)
    assert set(verdicts.values()) == {"holds"}
    assert len(verdicts) == 3  # the window claim needs long-range lengths: left out

    contradicting = _capacity(
        {
            "full": {4: 1.0, 16: 0.9, 64: 0.5},
            "linear": {4: 0.98, 16: 0.97, 64: 0.95},
            "deltanet": {4: 0.95, 16: 0.5, 64: 0.2},
        }
    )
    verdicts = _verdicts(contradicting)
    assert set(verdicts.values()) == {"does not hold"}


def test_a_state_model_that_never_learned_is_not_comparable():
    unlearned = {"full": EXACT, "linear": {4: 0.05, 16: 0.02, 64: 0.01}}
    verdicts = _verdicts(_capacity({**unlearned, "deltanet": {4: 0.6, 16: 0.4, 64: 0.2}}))
    assert verdicts["Fixed-state models lose recall as the pairs outgrow the state"] == (
        "not comparable"
    )
    # DeltaNet far ahead, but neither learned: the budget speaks, not the method.
    assert verdicts["The delta rule recalls at least as well as linear attention"] == (
        "not comparable"
    )


def test_records_that_test_nothing_give_no_table():
    timing = load.tidy(pd.DataFrame(synthetic_records()))  # random-token timing runs
    assert published.published(timing) is None


# --- MAD and ListOps (analysis/suites.py) ---

#           compression fuzzy in-context memorize noisy copy
EXACT_MAD = [0.30, 0.65, 1.00, 0.99, 1.00, 0.98]
DELTA_MAD = [0.25, 0.70, 1.00, 0.99, 1.00, 0.99]


def _suite_verdicts(frame: pd.DataFrame) -> dict[str, str]:
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


def test_the_mad_claims_read_the_table():
    verdicts = _suite_verdicts(mad_sweep({"full": EXACT_MAD, "deltanet": DELTA_MAD}))
    assert verdicts == {
        "attention solves": "holds",
        "delta rule recalls": "holds",
        "memorizes": "not comparable",  # both at the ceiling of vocabulary 256
        "average": "does not hold",  # 82.0 vs 82.2
    }
    behind = [0.25, 0.62, 1.00, 0.99, 1.00, 0.99]  # 3 points behind exact attention on fuzzy
    sweep = mad_sweep({"full": EXACT_MAD, "deltanet": behind}, interval=0.03)
    assert _suite_verdicts(sweep)["delta rule recalls"] == "holds"  # inside the intervals
    sweep = mad_sweep({"full": EXACT_MAD, "deltanet": behind}, interval=0.01)
    assert _suite_verdicts(sweep)["delta rule recalls"] == "does not hold"
    weak = [0.30, 0.40, 0.60, 0.99, 0.95, 0.98]  # exact attention below the paper in-context
    verdicts = _suite_verdicts(
        mad_sweep({"full": weak, "deltanet": [0.2, 0.3, 0.5, 0.6, 0.9, 0.9]})
    )
    assert verdicts["attention solves"] == "does not hold"
    assert verdicts["delta rule recalls"] == "not comparable"  # exact did not learn in-context
    assert verdicts["memorizes"] == "holds" and verdicts["average"] == "holds"


def test_the_listops_claims_read_the_table():
    agreeing = {"full": 0.62, "lsh": 0.63, "performer": 0.3, "linear": 0.35, "blockwise": 0.4}
    assert _suite_verdicts(listops_sweep(agreeing)) == {
        "no variant beats": "holds",
        "kernel and local fall": "holds",
    }
    within = {**agreeing, "lsh": 0.65}  # 3 points above, inside the +-4-point intervals
    assert _suite_verdicts(listops_sweep(within))["no variant beats"] == "holds"
    contradicting = {**agreeing, "lsh": 0.75, "linear": 0.6}
    assert _suite_verdicts(listops_sweep(contradicting)) == {
        "no variant beats": "does not hold",
        "kernel and local fall": "does not hold",
    }
    at_floor = {"full": 0.2, "performer": 0.18}
    assert _suite_verdicts(listops_sweep(at_floor))["kernel and local fall"] == "not comparable"


def test_moba_with_every_block_reads_its_covering_probe_beside_a_capacity_sweep(monkeypatch):
    from analysis import coverage

    capacity_sweep = _capacity({"full": EXACT})
    claim = published.moba_with_every_block_is_full_attention
    ours, verdict = claim(capacity_sweep)  # the committed snapshot's probe
    assert ours.startswith("MoBA, blocks of 16 and top_k 16 (every block), at 4 / 8 / 16 / 32 / 64")
    assert verdict == "holds"
    probe = _capacity({"moba": {4: 0.99, 16: 0.9, 64: 0.6}}).assign(
        sweep="coverage_probes", **{"attention.block_size": 16, "attention.top_k": 16}
    )
    monkeypatch.setattr(coverage, "probe_records", lambda frame=None, snapshot=None: probe)
    assert claim(capacity_sweep) == (
        "MoBA, blocks of 16 and top_k 16 (every block), at 4 / 16 / 64 pairs: 99.0 / 90.0 / 60.0 %",
        "does not hold",
    )
    assert claim(load.tidy(pd.DataFrame([{"attention": "full", "task": "long_recall"}]))) is None
