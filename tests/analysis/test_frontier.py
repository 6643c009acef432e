"""The recall-against-state frontier from capacity records that carry decode_state_bytes."""

from __future__ import annotations

import itertools
import random

import pandas as pd
import pytest

from analysis import frontier, report
from tests.analysis.suite_records import capacity_sweep

BATCH = 16
# Per point: (attention, options, n_heads, state bytes of the batch, accuracy per count).
POINTS = [
    ("full", {}, 4, BATCH * 262144, (1.0, 1.0, 0.99, 0.99, 0.98)),
    ("linear", {}, 4, BATCH * 8704, (0.99, 0.97, 0.92, 0.6, 0.3)),
    ("deltanet", {}, 4, BATCH * 8192, (1.0, 0.99, 0.97, 0.95, 0.7)),
    ("deltanet", {}, 2, BATCH * 16384, (1.0, 1.0, 0.99, 0.97, 0.8)),
    ("sliding_window", {"attention.window": 64}, 4, BATCH * 65536, (1.0, 0.9, 0.7, 0.5, 0.4)),
    ("sliding_window", {"attention.window": 128}, 4, BATCH * 131072, (1.0, 1.0, 0.9, 0.8, 0.7)),
    # Never learned: its accuracy is the budget's, it stays off the frontier.
    ("performer", {}, 4, BATCH * 1000, (0.3, 0.2, 0.1, 0.05, 0.02)),
]


def frontier_sweep(points=POINTS, *, state: bool = True) -> pd.DataFrame:
    return capacity_sweep(
        (
            attention,
            values,
            {
                **options,
                "batch_size": BATCH,
                "d_model": 64,
                "n_heads": heads,
                "train.steps": 2000,
                "trained_steps": 2000,
                "measure.decode_scope": "model",
                "decode_state_bytes": nbytes if state else None,
            },
        )
        for attention, options, heads, nbytes, values in points
    )


def brute_force_front(state: list[float], recall: list[float]) -> list[bool]:
    """On the frontier: no other point with state <= and recall >=, one of them strict."""
    return [
        not any(
            s2 <= s and r2 >= r and (s2 < s or r2 > r)
            for j, (s2, r2) in enumerate(zip(state, recall, strict=True))
            if j != i
        )
        for i, (s, r) in enumerate(zip(state, recall, strict=True))
    ]


@pytest.mark.parametrize("seed", range(30))
def test_pareto_front_is_the_brute_force_front(seed):
    """Random points on a coarse grid, so that equal states and equal recalls occur."""
    rng = random.Random(seed)
    n = rng.randint(1, 25)
    state = [float(rng.choice([1, 2, 4, 8, 16, 32])) for _ in range(n)]
    recall = [rng.choice([0.1, 0.5, 0.5, 0.9, 1.0]) for _ in range(n)]
    got = frontier.pareto_front(pd.Series(state, index=range(100, 100 + n)), pd.Series(recall))
    assert got.tolist() == brute_force_front(state, recall)
    assert list(got.index) == list(range(100, 100 + n))


def test_pareto_front_of_every_small_case():
    values = (1.0, 2.0)
    for n in (1, 2, 3):
        for state in itertools.product(values, repeat=n):
            for recall in itertools.product(values, repeat=n):
                got = frontier.pareto_front(pd.Series(state), pd.Series(recall)).tolist()
                assert got == brute_force_front(list(state), list(recall)), (state, recall)


def test_points_are_per_variant_knob_and_head_dim_with_their_state_per_sequence():
    points, missing = frontier.frontier_points(frontier_sweep())
    assert missing == []
    by = points.set_index(["point", "head_dim"])
    assert by.loc[("deltanet", 16), frontier.STATE] == 8192  # the batch's bytes / batch_size
    assert by.loc[("deltanet", 32), frontier.STATE] == 16384
    assert by.loc[("sliding_window window=64", 16), frontier.STATE] == 65536
    assert by.loc[("deltanet", 16), frontier.RECALL] == pytest.approx(
        (1 + 0.99 + 0.97 + 0.95 + 0.7) / 5
    )
    assert by.loc[("deltanet", 16), frontier.AT_MOST] == pytest.approx(0.7)
    # Sorted by state; on the frontier: deltanet 16 (smallest learned state), deltanet 32
    # (more recall for more), full (the most recall); linear and the windows are dominated.
    assert list(points[frontier.STATE]) == sorted(points[frontier.STATE])
    on = set(
        points.loc[points[frontier.ON_FRONTIER], "point"]
        + "/"
        + points.loc[points[frontier.ON_FRONTIER], "head_dim"].map(str)
    )
    assert on == {"deltanet/16", "deltanet/32", "full/16"}
    assert not by.loc[("performer", 16), frontier.ON_FRONTIER]


def test_the_table_says_what_dominates_a_point_and_what_was_not_learned():
    table = frontier.frontier_table(frontier_sweep())
    rows = {(r["variant"], r["head dim"]): r for r in table.frame.to_dict("records")}
    assert rows[("deltanet", 16)]["frontier"] == "yes"
    assert rows[("linear", 16)]["frontier"] == "no: deltanet (head dim 16)"
    assert rows[("sliding_window window=128", 16)]["frontier"] == "no: deltanet (head dim 16)"
    assert rows[("performer", 16)]["frontier"] == "— (not learned)"
    assert rows[("full", 16)]["state / sequence"] == "256 KiB"
    assert rows[("deltanet", 16)]["recall at 64 pairs (%)"] == "70.0"
    assert "the whole model: every layer's cache" in table.note


def test_records_without_a_state_are_named_not_drawn():
    measured = frontier_sweep(POINTS[:3])
    without = frontier_sweep(POINTS[3:], state=False)
    without["job"] = "x" + without["job"]
    table = frontier.frontier_table(pd.concat([measured, without], ignore_index=True))
    assert {r["variant"] for r in table.frame.to_dict("records")} == {"full", "linear", "deltanet"}
    assert "carry no decode_state_bytes (measure.decode_state): " in table.note
    assert frontier.frontier_table(frontier_sweep(state=False)) is None
    assert not frontier.has_points(frontier_sweep(state=False))


def test_the_report_has_the_table_and_the_figure():
    frame = frontier_sweep()
    assert frontier.frontier_table in report.TABLES
    assert report.not_applicable("recall_vs_state", frame) is None
    assert "Recall against decoding state" in report.markdown_tables(frame)
    figure = frontier.recall_vs_state(frame)
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert "Pareto frontier" in [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert labels  # a point per configuration
    reason = report.not_applicable("recall_vs_state", frontier_sweep(state=False))
    assert reason is not None and "decode_state_bytes" in reason
