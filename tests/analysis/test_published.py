"""Published results beside ours (analysis/published.py): each verdict read from records."""

from __future__ import annotations

import json

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


# --- the 2026 families: Gated DeltaNet, and hybrid stacks ---

GATED = "Gated DeltaNet recalls at least as well as DeltaNet and Mamba-2"
HYBRID = "A few full attention layers recover exact attention's recall in a hybrid stack"


def test_gated_deltanet_against_deltanet_and_mamba2_on_capacity():
    rivals = {"deltanet": {4: 1.0, 16: 0.9, 64: 0.5}, "mamba2": {4: 0.95, 16: 0.6, 64: 0.2}}
    level = _capacity({"full": EXACT, "gated_deltanet": {4: 1.0, 16: 0.9, 64: 0.49}, **rivals})
    table = published.published(level)
    row = table.frame.set_index("published result").loc[GATED]
    assert row["verdict"] == "holds"  # 79.7 against 80.0: within a point
    assert "Gated DeltaNet 79.7 %, deltanet 80.0 %, mamba2 58.3 %" in row["ours"]
    behind = _capacity({"full": EXACT, "gated_deltanet": {4: 1.0, 16: 0.8, 64: 0.4}, **rivals})
    assert _verdicts(behind)[GATED] == "does not hold"
    # Mamba-2 never learned: only DeltaNet counts; neither learned: not comparable.
    unlearned = {**rivals, "mamba2": {4: 0.3, 16: 0.1, 64: 0.05}}
    frame = _capacity({"full": EXACT, "gated_deltanet": {4: 1.0, 16: 0.95, 64: 0.6}, **unlearned})
    row = published.published(frame).frame.set_index("published result").loc[GATED]
    assert row["verdict"] == "holds" and "(mamba2: not both learned, not counted)" in row["ours"]
    alone = _capacity({"full": EXACT, "gated_deltanet": {4: 0.5, 16: 0.3, 64: 0.1}, **rivals})
    assert _verdicts(alone)[GATED] == "not comparable"
    assert GATED not in _verdicts(_capacity({"full": EXACT, **rivals}))  # nothing to test


def _hybrid(accuracy: dict[str, float], learned_full: bool = True) -> pd.DataFrame:
    """Recall jobs of the hybrid preset's shape: each stack at 64 and 1024 tokens."""
    from tests.analysis.test_hybrid import STACKS

    rows = []
    for number, (stack, value) in enumerate(accuracy.items()):
        layers = STACKS[stack][0] if stack in STACKS else stack.split("|")
        label = stack if stack in STACKS else stack.replace("|", "+")
        for length, acc in ((64, 1.0 if learned_full or stack != "full" else 0.5), (1024, value)):
            rows.append(
                {
                    "sweep": "hybrid",
                    "job": f"{number}" + ("/64" if length == 64 else ""),
                    "status": "ok",
                    "attention": "full",
                    "layers": label,
                    "model.layers": None if layers is None else json.dumps(layers),
                    "task": "long_recall",
                    "seq_len": length,
                    "depth": 4,
                    "d_model": 64,
                    "seed": 0,
                    "eval_accuracy": acc,
                    "trained_steps": 1000 if length == 64 else 1150,
                }
            )
    return load.tidy(pd.DataFrame(rows))


def test_a_hybrid_with_few_full_layers_recovers_recall_or_not():
    recovers = _hybrid({"full": 0.99, "deltanet": 0.3, "3×deltanet+full": 0.97})
    row = published.published(recovers).frame.set_index("published result").loc[HYBRID]
    assert row["verdict"] == "holds"
    assert row["ours"] == (
        "at 1024 tokens, every layer full 99.0 %; deltanet 30.0 % → 3×deltanet+full 97.0 %"
    )
    short = _hybrid({"full": 0.99, "deltanet": 0.3, "3×deltanet+full": 0.8})
    assert _verdicts(short)[HYBRID] == "does not hold"
    # The all-efficient stack already recalls: no gap, nothing to recover.
    level = _hybrid({"full": 0.99, "deltanet": 0.97, "3×deltanet+full": 0.98})
    assert _verdicts(level)[HYBRID] == "not comparable"
    # The all-full stack never learned: not comparable.
    unlearned = _hybrid({"full": 0.5, "deltanet": 0.3, "3×deltanet+full": 0.4}, learned_full=False)
    assert _verdicts(unlearned)[HYBRID] == "not comparable"
    assert HYBRID not in _verdicts(_capacity({"full": EXACT, "linear": EXACT}))


def test_a_hybrid_is_read_against_its_own_efficient_layer_options_included():
    small = "sliding_window(window=16)"
    frame = _hybrid(
        {
            "full": 0.99,
            "sliding_window": 0.05,
            f"3×{small}+full": 0.97,  # the first hybrid of the fewest full layers
            "3×sliding_window+full": 0.05,
            small: 0.03,
        }
    )
    row = published.published(frame).frame.set_index("published result").loc[HYBRID]
    assert f"{small} 3.0 % → 3×{small}+full 97.0 %" in row["ours"]
    assert "sliding_window 5.0 % → 3×sliding_window+full 5.0 %" in row["ours"]
    assert row["verdict"] == "does not hold"


SINKS = "Attention sinks stabilise a sliding window's perplexity, not its recall beyond reach"


def _sinks(at_long: dict[tuple[int, bool], float], control: float = 1.0) -> pd.DataFrame:
    """sliding_window on long-range recall, each sink form at 64 (control) and 1024 tokens."""
    rows = []
    for number, ((tokens, learned), value) in enumerate(at_long.items()):
        for length, acc in ((64, control), (1024, value)):
            rows.append(
                {
                    "sweep": "long_range_quick",
                    "job": f"{number}" + ("/64" if length == 64 else ""),
                    "status": "ok",
                    "attention": "sliding_window",
                    "attention.sink_tokens": tokens,
                    "attention.learned_sink": learned,
                    "task": "long_recall",
                    "seq_len": length,
                    "seed": 0,
                    "eval_accuracy": acc,
                    "trained_steps": 500 if length == 64 else 650,
                }
            )
    return load.tidy(pd.DataFrame(rows))


def test_sinks_do_not_bring_back_recall_beyond_the_window_or_do():
    lost = _sinks({(0, False): 0.05, (4, False): 0.06, (0, True): 0.05})
    row = published.published(lost).frame.set_index("published result").loc[SINKS]
    assert row["verdict"] == "holds"
    assert "4 sink tokens 100.0 % / 6.0 %" in row["ours"] and "a learned sink" in row["ours"]
    assert _verdicts(_sinks({(0, False): 0.05, (4, False): 0.9}))[SINKS] == "does not hold"
    assert _verdicts(_sinks({(0, False): 0.05, (4, True): 0.05}, control=0.5))[SINKS] == (
        "not comparable"
    )
    assert published.published(_sinks({(0, False): 0.05})) is None  # no form with sinks


def _long_range(at: dict[str, dict[int, float]]) -> pd.DataFrame:
    """Long-range recall records: per variant, its accuracy at each length (one job each)."""
    rows = [
        {
            "sweep": "long_range_quick",
            "job": f"{attention}-{length}",
            "status": "ok",
            "attention": attention,
            "task": "long_recall",
            "seq_len": length,
            "seed": 0,
            "eval_accuracy": value,
            "trained_steps": 650,
        }
        for attention, by_length in at.items()
        for length, value in by_length.items()
    ]
    return load.tidy(pd.DataFrame(rows))


def test_the_state_claims_read_the_longest_length_both_variants_were_trained_at():
    """A probe of another variant at a longer length (routing at 2048) beside the records must
    not pick the length the delta-rule claims compare at."""
    frame = _long_range(
        {
            "linear": {64: 1.0, 1024: 0.5},
            "deltanet": {64: 1.0, 1024: 0.95},
            "gated_deltanet": {64: 1.0, 1024: 0.96},
            "routing": {64: 1.0, 2048: 0.99},
        }
    )
    rows = published.published(frame).frame.set_index("published result")
    delta = rows.loc["The delta rule recalls at least as well as linear attention"]
    assert "at 1024 tokens: DeltaNet 95.0 %, linear 50.0 %" in delta["ours"]
    assert delta["verdict"] == "holds"
    assert "at 1024 tokens: Gated DeltaNet 96.0 %, deltanet 95.0 %" in rows.loc[GATED]["ours"]


def test_a_hybrid_is_read_against_the_stacks_of_its_own_head_count():
    """Plain models at another head count beside the stacks (capacity's head dim 32) are not
    averaged into the all-full and all-efficient stacks the mixed stack is read against."""
    frame = _hybrid({"full": 0.99, "deltanet": 0.3, "3×deltanet+full": 0.97}).assign(n_heads=4)
    wider = _hybrid({"full": 0.5, "deltanet": 0.9}).assign(n_heads=2)
    row = published.published(pd.concat([frame, wider], ignore_index=True))
    ours = row.frame.set_index("published result").loc[HYBRID]["ours"]
    assert ours == (
        "at 1024 tokens, every layer full 99.0 %; deltanet 30.0 % → 3×deltanet+full 97.0 %"
    )


def test_a_hybrid_is_read_against_the_stacks_of_its_own_depth():
    """Stacks at depth 2 and 4 in one sweep (capacity's 1 : 1 at depth 2, 3 : 1 at depth 4):
    each mixed stack is read against the all-full and all-efficient stacks of its own depth."""
    deep = _hybrid({"full": 0.99, "deltanet": 0.3, "3×deltanet+full": 0.97})
    shallow = _hybrid({"full": 0.95, "deltanet": 0.2, "deltanet|full": 0.4}).assign(depth=2)
    shallow["job"] = "s" + shallow["job"]
    row = published.published(pd.concat([shallow, deep], ignore_index=True))
    row = row.frame.set_index("published result").loc[HYBRID]
    assert row["ours"] == (
        "depth 2: at 1024 tokens, every layer full 95.0 %; deltanet 20.0 % → deltanet+full 40.0 %; "
        "depth 4: at 1024 tokens, every layer full 99.0 %; deltanet 30.0 % → 3×deltanet+full 97.0 %"
    )
    assert row["verdict"] == "does not hold"
