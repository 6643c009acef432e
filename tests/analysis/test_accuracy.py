"""Not learned is a result: the headline, the tables and the figures say so, with chance and
the key-blind floor; a capacity sweep gets its accuracy-vs-pairs table, figure and capacity."""

from __future__ import annotations

import pandas as pd

from analysis import accuracy, capacity, headline, load, tradeoff, trained_quality


def _long_range():
    """Two-stage jobs (64 then 1024, 400 + 150 steps): full learns, lsh never reaches 90 %
    (control 6.2 %), blockwise learns at 64 and loses its reach at 1024."""
    rows = []
    for job, (attention, at_64, at_1024, learned_at) in enumerate(
        (
            ("full", 0.99, 0.97, 200),
            ("lsh", 0.062, 0.058, None),
            ("blockwise", 0.98, 0.20, 300),
        )
    ):
        for length, value, steps, stage in (
            (64, at_64, 400, f"{job}/64"),
            (1024, at_1024, 550, str(job)),
        ):
            learned = learned_at is not None and learned_at <= steps
            rows.append(
                {
                    "sweep": "long_range_quick",
                    "job": stage,
                    "status": "ok",
                    "attention": attention,
                    "task": "long_recall",
                    "task.n_values": 16,
                    "block": "residual",
                    "seed": 0,
                    "seq_len": length,
                    "eval_accuracy": value,
                    "trained_steps": steps,
                    "learned": learned,
                    "steps_to_learn": learned_at if learned else None,
                    "chance_accuracy": 1 / 16,
                    "floor_accuracy": 0.0625 if length == 64 else 0.061,
                    "eval_accuracy_ci_low": value - 0.02,
                    "eval_accuracy_ci_high": min(1.0, value + 0.02),
                    "attn_fwd_bwd_ms": {"full": 20.0, "lsh": 9.0, "blockwise": 5.0}[attention],
                    "attn_fwd_bwd_peak_bytes": 2**20,
                }
            )
    return load.tidy(pd.DataFrame(rows))


def test_a_job_learned_when_any_stage_reached_ninety_percent():
    marked = accuracy.with_learned(_long_range()).set_index(["attention", "seq_len"])
    assert (
        marked.loc[("full", 64), "job_learned"] and marked.loc[("blockwise", 1024), "job_learned"]
    )
    assert not marked.loc[("lsh", 1024), "job_learned"]
    assert marked.loc[("lsh", 1024), "control_accuracy"] == 0.062
    assert marked.loc[("lsh", 64), "job_steps"] == 550


def test_the_headline_says_not_learned_and_prints_no_difference_for_it():
    lines = headline.headline(_long_range(), _long_range())
    lsh = next(line for line in lines if line.startswith("- **lsh**"))
    assert "long_recall: not learned in 550 steps (control 6.2%)" in lsh
    assert "points" not in lsh
    blockwise = next(line for line in lines if line.startswith("- **blockwise**"))
    assert "20.0% vs exact 97.0% at L=1,024 (−77.0 points)" in blockwise


def test_the_length_table_states_steps_learned_chance_floor_and_intervals():
    table = trained_quality.quality_by_length(_long_range())
    rows = {r["variant"]: r for r in table.frame.to_dict("records")}
    assert (
        "L=64 (400 steps)" in table.frame.columns and "L=1,024 (550 steps)" in table.frame.columns
    )
    assert rows["lsh"]["learned"] == "not learned in 550 steps (control 6.2%)"
    assert rows["full"]["learned"] == "yes, step 200"
    assert rows["full"]["L=1,024 (550 steps)"] == "97.0 [95.0–99.0]"
    assert rows["chance"]["L=64 (400 steps)"] == "6.2"
    assert rows["key-blind floor"]["L=1,024 (550 steps)"] == "6.1"


def test_the_figure_labels_the_variant_that_did_not_learn_and_draws_the_floor():
    figure = trained_quality.accuracy_vs_seq_len(_long_range())
    (ax,) = [a for a in figure.axes if a.get_legend() is not None]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("lsh") and "not learned in 550 steps" in label for label in labels)
    assert not any("not learned" in label for label in labels if label.startswith("full"))
    texts = [t.get_text() for t in ax.texts]
    assert "chance" in texts and "key-blind floor" in texts


def _capacity():
    """full holds every pair count; linear falls past 8 pairs at head dim 16 and 16 at 32;
    performer never learns."""
    rows = []
    for n_heads, head_dim in ((4, 16), (2, 32)):
        for job, pairs in enumerate((4, 8, 16, 32)):
            for attention in ("full", "linear", "performer"):
                if attention == "full":
                    value = 0.99
                elif attention == "linear":
                    value = 0.95 if pairs <= head_dim // 2 else 0.3
                else:
                    value = 0.2
                rows.append(
                    {
                        "sweep": "capacity",
                        "job": f"{attention}-{head_dim}-{job}",
                        "status": "ok",
                        "attention": attention,
                        "task": "recall",
                        "task.n_pairs": pairs,
                        "task.n_values": 256,
                        "seq_len": 256,
                        "d_model": 64,
                        "n_heads": n_heads,
                        "seed": 0,
                        "eval_accuracy": value,
                        "train.steps": 600,
                        "learned": value >= 0.9,
                        "chance_accuracy": 1 / 256,
                        "floor_accuracy": 1 / pairs,
                    }
                )
    return load.tidy(pd.DataFrame(rows))


def test_capacity_is_the_largest_pair_count_within_ten_points_of_exact():
    table = capacity.capacity(_capacity())
    rows = {r["variant"]: r for r in table.frame.to_dict("records")}
    assert rows["linear"] == {"variant": "linear", "head dim 16": "8", "head dim 32": "16"}
    assert rows["performer"]["head dim 16"].startswith("not learned in 600 steps")
    assert "reached ≥ 95 % at every point" in table.note


def test_accuracy_by_pairs_has_chance_and_floor_rows_and_a_figure_per_head_dim():
    table = capacity.accuracy_by_pairs(_capacity())
    rows = table.frame.to_dict("records")
    floor = next(r for r in rows if r["variant"] == "key-blind floor")
    assert floor["4 pairs"] == "25.0" and floor["32 pairs"] == "3.1"
    assert any(r["variant"] == "performer (not learned)" for r in rows)
    figure = capacity.accuracy_vs_pairs(_capacity())
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["head dim 16", "head dim 32"]
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert any(label.startswith("performer (not learned") for label in labels)
    assert "key-blind floor" in labels


def test_the_tradeoff_chart_draws_chance_and_floor_and_labels_not_learned():
    (ax,) = tradeoff.tradeoff(_long_range()).axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("lsh") and label.endswith("not learned") for label in labels)
    assert not any(label.startswith("full") and "not learned" in label for label in labels)
    flat = [line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1]
    assert 100 / 16 in flat and 6.1 in [round(v, 1) for v in flat]
