"""A learning-rate grid per variant, chosen on the validation split (analysis/tuning.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import accuracy, capacity, load, series, tuning

PAIRS = (4, 16)
RATES = (1e-3, 3e-3, 1e-2)


def _grid_sweep(valid, reported, *, seeds=(0, 1), status=None) -> pd.DataFrame:
    """One job per (variant, lr, seed), recorded at 4 pairs (its own) and 16 (a point).

    valid / reported: variant -> lr -> accuracy at every point (validation / eval split);
    status: (variant, lr) -> a status other than ok (no accuracy then)."""
    rows, job = [], 0
    for attention, by_rate in valid.items():
        for rate in RATES:
            for seed in seeds:
                ended = (status or {}).get((attention, rate), "ok")
                for pairs in PAIRS:
                    own = pairs == PAIRS[0]
                    ok = ended == "ok"
                    rows.append(
                        {
                            "sweep": "capacity",
                            "job": str(job) if own else f"{job}/n_pairs={pairs}",
                            "status": ended,
                            "attention": attention,
                            "task": "recall",
                            "task.n_pairs": pairs,
                            "task.n_values": 256,
                            "train.lr": rate,
                            "train.steps": 1000,
                            "train.stop_accuracy": 0.99,
                            "seq_len": 256,
                            "d_model": 64,
                            "n_heads": 4,
                            "seed": seed,
                            "valid_accuracy": by_rate[rate] if ok else None,
                            "eval_accuracy": reported[attention][rate] if ok else None,
                            "trained_steps": 1000,
                            "learned": ok and reported[attention][rate] >= 0.9,
                            "chance_accuracy": 1 / 256,
                            "floor_accuracy": 1 / pairs,
                        }
                    )
                job += 1
    return load.tidy(pd.DataFrame(rows))


VALID = {
    "full": {1e-3: 0.5, 3e-3: 1.0, 1e-2: 0.99},
    "linear": {1e-3: 0.2, 3e-3: 0.4, 1e-2: 0.95},
}


def test_each_variant_keeps_the_rate_best_on_validation_not_on_the_reported_numbers():
    # The reported accuracies prefer other rates: the choice must not follow them.
    reported = {
        "full": {1e-3: 1.0, 3e-3: 0.98, 1e-2: 0.97},
        "linear": {1e-3: 0.99, 3e-3: 0.5, 1e-2: 0.93},
    }
    trained = series.trained_quality(_grid_sweep(VALID, reported))
    chosen = trained.groupby("attention")["train.lr"].unique().map(list).to_dict()
    assert chosen == {"full": [3e-3], "linear": [1e-2]}
    assert set(trained["lr_grid"]) == {"{0.001, 0.003, 0.01}"}
    assert (trained.groupby("attention")["seed"].nunique() == 2).all()  # every seed kept
    assert len(trained) == 2 * 2 * len(PAIRS)


def test_a_rate_whose_jobs_did_not_end_ok_scores_zero():
    valid = {"full": {1e-3: 0.5, 3e-3: 1.0, 1e-2: 0.99}}
    sweep = _grid_sweep(valid, valid, status={("full", 3e-3): "diverged"})
    trained = series.trained_quality(sweep)
    assert set(trained["train.lr"]) == {1e-2}  # the best that ended ok


def test_a_single_rate_or_no_validation_is_left_as_it_is():
    sweep = _grid_sweep(VALID, VALID)
    one = sweep[sweep["train.lr"] == 1e-3]
    assert len(series.trained_quality(one)) == len(one)
    assert "lr_grid" not in series.trained_quality(one)
    blind = sweep.drop(columns=["valid_accuracy"])
    assert len(series.trained_quality(blind)) == len(blind)  # nothing to choose on


def test_not_learned_at_any_rate_of_the_grid_says_so_with_the_protocol():
    valid = {
        "full": {1e-3: 1.0, 3e-3: 1.0, 1e-2: 1.0},
        "routing": {1e-3: 0.3, 3e-3: 0.4, 1e-2: 0.2},
    }
    table = capacity.capacity(_grid_sweep(valid, valid))
    rows = {r["variant"]: r for r in table.frame.to_dict("records")}
    assert rows["routing"]["head dim 16"].startswith(
        "not learned in 1000 steps at any lr of {0.001, 0.003, 0.01}"
    )
    assert rows["routing"]["lr per head dim"] == "0.003"
    assert "Protocol: lr per variant from {0.001, 0.003, 0.01}, chosen on the validation" in (
        table.note
    )
    assert "stop at 99 % on validation" in table.note and "2 seed(s)" in table.note


def test_seeds_that_differ_in_learning_are_counted():
    sweep = _grid_sweep(VALID, VALID)
    # linear at its chosen rate: seed 1 did not learn.
    late = (sweep["attention"] == "linear") & (sweep["seed"] == 1)
    sweep.loc[late, ["eval_accuracy", "learned"]] = [0.3, False]
    table = capacity.accuracy_by_pairs(sweep)
    assert "linear (1 of 2 seeds learned)" in set(table.frame["variant"])


def test_the_protocol_line_without_a_grid_names_the_rate_and_no_stop():
    frame = pd.DataFrame({"train.lr": [0.01], "train.steps": [500], "seed": [0]})
    assert tuning.protocol_line(frame) == (
        "Protocol: lr 0.01; cap 500 steps (the final stage's); no early stop; "
        "1 seed(s), each shown in its range."
    )


def test_the_protocol_line_of_a_curriculum_names_each_stages_cap():
    stages = '[{"seq_len": 64, "steps": 1000}, {"seq_len": 128, "steps": 150}]'
    frame = pd.DataFrame(
        {"train.lr": [0.01] * 2, "train.steps": [150] * 2, "seed": [0] * 2}
        | {"train.curriculum": [stages, None]}  # the final stage's record has none
    )
    assert "caps 1000 + 150 + 150 steps (1300 in all, a stage each)" in tuning.protocol_line(frame)
    frame["train.curriculum"] = [[{"seq_len": 64, "steps": 1000}]] * 2  # read back as lists
    assert "caps 1000 + 150 steps (1150 in all, a stage each)" in tuning.protocol_line(frame)


def test_seeds_added_at_the_chosen_rate_alone_do_not_move_the_choice():
    # seed 0 ran the whole grid; seeds 1 and 2 ran only linear's chosen 1e-2, and did badly
    # there: averaged in, they would make 3e-3 (0.4) look better than 1e-2 ((0.95 + 0 + 0) / 3)
    frame = _grid_sweep({"linear": VALID["linear"]}, {"linear": VALID["linear"]}, seeds=(0,))
    zero = {"linear": {r: 0.0 for r in RATES}}
    later = _grid_sweep(zero, {"linear": VALID["linear"]}, seeds=(1, 2))
    later = later[later["train.lr"] == 1e-2]
    both = pd.concat([frame, later], ignore_index=True)
    chosen = tuning.choose_learning_rates(both, series.context_columns(both))
    assert set(chosen["train.lr"]) == {1e-2}
    assert set(chosen["seed"]) == {0, 1, 2}  # the later seeds are kept, and shown


def test_chosen_rates_give_the_overrides_that_run_each_variant_at_its_rate():
    frame = _grid_sweep(VALID, VALID, seeds=(0,))
    frame["attention.block_size"] = 16.0
    frame["attention.parts"] = '["local", "global"]'
    rates = tuning.chosen_rates(frame, series.context_columns(frame))
    lines = dict(zip(rates["attention"], rates["overrides"], strict=True))
    assert lines["full"] == (
        "attention=full attention.block_size=16 attention.parts=[local,global] train.lr=0.003"
    )
    assert lines["linear"].endswith("train.lr=0.01")
    assert all(" " not in token for line in lines.values() for token in line.split())


def test_the_command_line_prints_one_override_line_per_variant(tmp_path, capsys):
    frame = _grid_sweep(VALID, VALID, seeds=(0,))
    path = tmp_path / "results.csv"
    frame.drop(columns=["variant"], errors="ignore").to_csv(path, index=False)
    tuning.main([str(path), "--overrides"])
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == ["attention=full train.lr=0.003", "attention=linear train.lr=0.01"]
    tuning.main([str(path)])
    table = capsys.readouterr().out
    assert "lr_chosen" in table and "linear" in table


def test_the_written_table_is_what_the_preset_reads(tmp_path, monkeypatch):
    """`--write` from a grid, read back through `${tuned_lr:...}`: each variant's chosen rate."""
    from experiments.app import resolvers

    sweep = _grid_sweep(VALID, VALID)
    rates = tuning.chosen_rates(sweep, series.context_columns(sweep))
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "demo.yaml").write_text(tuning.rate_table(rates, sweep, "multirun/x"))
    monkeypatch.setattr(resolvers, "config_dir", lambda: tmp_path)
    assert resolvers.tuned_lr("demo", "full") == 3e-3
    assert resolvers.tuned_lr("demo", "linear") == 1e-2
    assert "multirun/x" in (tmp_path / "tuned" / "demo.yaml").read_text()


def test_merge_keeps_the_tables_other_variants_and_replaces_the_tuned_ones(
    tmp_path, monkeypatch, capsys
):
    """`--write FILE --merge`: a grid of a few variants joins the table; the entries of other
    variants (and their comments) stay, a variant tuned again has one entry, the new one."""
    from experiments.app import resolvers

    (tmp_path / "tuned").mkdir()
    target = tmp_path / "tuned" / "demo.yaml"
    target.write_text("# An earlier grid.\nfull: 0.01\nlsh: 0.001\n# lsh's note\n")
    assert tuning.main([str(_grid_csv(tmp_path)), "--write", str(target), "--merge"]) == 0
    text = target.read_text()
    assert text.startswith("# An earlier grid.\n") and "# lsh's note" in text
    assert "# full, linear: merged by\n# `python -m analysis.tuning" in text
    entries = [line for line in text.splitlines() if not line.startswith("#") and line]
    assert entries == ["lsh: 0.001", "full: 0.003", "linear: 0.01"]
    monkeypatch.setattr(resolvers, "config_dir", lambda: tmp_path)
    assert resolvers.tuned_rates("demo") == {"lsh": 1e-3, "full": 3e-3, "linear": 1e-2}
    # Merged again: the same table (nothing doubled).
    assert tuning.main([str(_grid_csv(tmp_path)), "--write", str(target), "--merge"]) == 0
    assert target.read_text() == text
    # Into a table that does not exist yet: written whole; --merge alone is a mistake.
    fresh = tmp_path / "tuned" / "fresh.yaml"
    assert tuning.main([str(_grid_csv(tmp_path)), "--write", str(fresh), "--merge"]) == 0
    assert fresh.read_text().startswith("# Learning rates chosen on the validation split")
    capsys.readouterr()
    assert tuning.main([str(_grid_csv(tmp_path)), "--merge"]) == 1
    assert capsys.readouterr().err == "error: --merge: only with --write FILE\n"


def test_a_variant_run_at_one_rate_beside_the_grid_is_not_written_as_chosen():
    """A sweep that holds a grid for some variants and one rate for another (a reference run
    at a fixed rate): the table holds the grid's choices only."""
    sweep = _grid_sweep(VALID, VALID, seeds=(0,))
    fixed = sweep[(sweep["attention"] == "linear") & (sweep["train.lr"] == 1e-3)]
    frame = pd.concat([sweep[sweep["attention"] == "full"], fixed], ignore_index=True)
    rates = tuning.chosen_rates(frame, series.context_columns(frame))
    assert set(rates["attention"]) == {"full", "linear"}  # --overrides runs both
    lines = tuning.rate_table(rates, frame, "multirun/x").splitlines()
    assert "full: 0.003" in lines and not any(line.startswith("linear:") for line in lines)
    with pytest.raises(ValueError, match="no variant here ran a learning-rate grid"):
        tuning.rate_table(rates[rates["attention"] == "linear"], frame, "multirun/x")


def test_a_run_at_fixed_rates_per_variant_is_labelled_fixed_not_chosen():
    """The preset at its tuned rates: one rate per variant, no grid in the records."""
    sweep = _grid_sweep(VALID, VALID)
    fixed = sweep[
        ((sweep["attention"] == "full") & (sweep["train.lr"] == 3e-3))
        | ((sweep["attention"] == "linear") & (sweep["train.lr"] == 1e-2))
    ]
    trained = series.trained_quality(fixed)
    assert trained["lr_chosen"].tolist() == trained["train.lr"].tolist()
    assert "lr_grid" not in trained or trained["lr_grid"].isna().all()
    line = tuning.protocol_line(trained)
    assert "fixed (one each: 0.003, 0.01)" in line and "chosen" not in line


def _byte_sweep(valid_loss, reported_bpb, status=None) -> pd.DataFrame:
    """One job per (variant, lr) of a byte task: held-out `valid_loss` (nats) and reported
    `eval_bits_per_byte`, variant -> lr -> value; status: (variant, lr) -> not ok."""
    rows = []
    for job, (attention, rate) in enumerate(
        (a, r) for a in valid_loss for r in RATES
    ):  # fmt: skip
        ok = (status or {}).get((attention, rate), "ok") == "ok"
        rows.append(
            {
                "sweep": "swap", "job": str(job), "status": "ok" if ok else "diverged",
                "attention": attention, "task": "text", "train.lr": rate, "seq_len": 1024,
                "d_model": 128, "n_heads": 4, "seed": 0, "trained_steps": 400,
                "valid_loss": valid_loss[attention][rate] if ok else None,
                "eval_bits_per_byte": reported_bpb[attention][rate] if ok else None,
            }
        )  # fmt: skip
    return load.tidy(pd.DataFrame(rows))


def test_a_byte_task_keeps_the_rate_lowest_in_held_out_loss_not_in_reported_bits():
    valid = {
        "full": {1e-3: 1.95, 3e-3: 1.90, 1e-2: 2.30},
        "linear": {1e-3: 2.4, 3e-3: 2.5, 1e-2: 2.6},
    }
    reported = {
        "full": {1e-3: 2.70, 3e-3: 2.80, 1e-2: 2.60},
        "linear": {1e-3: 3.6, 3e-3: 3.4, 1e-2: 3.3},
    }
    trained = series.trained_quality(_byte_sweep(valid, reported), "eval_bits_per_byte")
    chosen = dict(zip(trained["attention"], trained["train.lr"], strict=True))
    assert chosen == {"full": 3e-3, "linear": 1e-3}
    # A rate whose job did not end ok can never be chosen, however low the others' loss is.
    sweep = _byte_sweep(valid, reported, status={("full", 3e-3): "diverged"})
    trained = series.trained_quality(sweep, "eval_bits_per_byte")
    assert set(trained.loc[trained["attention"] == "full", "train.lr"]) == {1e-3}


# --- A variant with no usable rate, and untuned variants -------------------------------------


def _no_usable_rate_for_linear(how: str) -> pd.DataFrame:
    """A grid where every linear job diverged (with figures that look learned) or, ok, validated
    NaN; full is tuned as usual."""
    if how == "diverged":
        status = {("linear", r): "diverged" for r in RATES}
        sweep = _grid_sweep(VALID, VALID, status=status, seeds=(0,))
        rows = sweep["attention"] == "linear"
        sweep.loc[rows, ["valid_accuracy", "eval_accuracy"]] = [0.5, 0.95]  # before it diverged
        return sweep
    sweep = _grid_sweep(VALID, VALID, seeds=(0,))
    sweep.loc[sweep["attention"] == "linear", "valid_accuracy"] = float("nan")
    return sweep


@pytest.mark.parametrize("how", ["diverged", "validated NaN"])
def test_a_variant_with_no_usable_rate_is_written_as_such_not_as_chosen(tmp_path, monkeypatch, how):
    """Every linear job diverged (or validated NaN): the smallest rate was written as "chosen on
    the validation split", and a diverged record at 95 % counted as learned."""
    from experiments.app import resolvers

    sweep = _no_usable_rate_for_linear(how)
    rates = tuning.chosen_rates(sweep, series.context_columns(sweep)).set_index("attention")
    assert rates.loc["full", "lr_chosen"] == 3e-3
    assert pd.isna(rates.loc["linear", "lr_chosen"])
    # Ok jobs at 95 % did learn, unvalidated; diverged ones never count.
    assert rates.loc["linear", "lr_any_learned"] == (how != "diverged")
    assert "train.lr" not in rates.loc["linear", "overrides"]
    text = tuning.rate_table(rates.reset_index(), sweep, "multirun/x")
    lines = text.splitlines()
    assert "full: 0.003" in lines and "linear: null" in lines
    assert any(line.startswith("# No usable rate: linear (") for line in lines), text
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "demo.yaml").write_text(text)
    monkeypatch.setattr(resolvers, "config_dir", lambda: tmp_path)
    assert resolvers.tuned_lr("demo", "full") == 3e-3
    assert resolvers.tuned_lr("demo", "linear", 2e-3) == 2e-3  # untuned: the fallback


def test_a_job_that_did_not_end_ok_never_counts_as_learned():
    sweep = _no_usable_rate_for_linear("diverged")
    chosen = tuning.choose_learning_rates(sweep, series.context_columns(sweep))
    linear = chosen[chosen["attention"] == "linear"]
    assert not linear["lr_any_learned"].any() and linear["lr_chosen"].isna().all()


def test_an_unusable_rate_is_never_chosen_over_a_usable_one():
    # linear's 1e-3 diverged; 3e-3 and 1e-2 ended ok but learned nothing (validation 0): the
    # choice is among the rates that ended ok, not the smallest of all.
    valid = {"linear": {1e-3: 0.0, 3e-3: 0.0, 1e-2: 0.0}}
    sweep = _grid_sweep(valid, valid, seeds=(0,), status={("linear", 1e-3): "diverged"})
    chosen = tuning.choose_learning_rates(sweep, series.context_columns(sweep))
    assert set(chosen["lr_chosen"]) == {3e-3}


def test_untuned_rows_say_so_where_the_lr_is_shown():
    sweep = _grid_sweep(VALID, VALID)
    fixed = sweep[
        ((sweep["attention"] == "full") & (sweep["train.lr"] == 3e-3))
        | ((sweep["attention"] == "linear") & (sweep["train.lr"] == 1e-3))
    ].copy()
    fixed["lr_source"] = fixed["attention"].map({"full": "tuned", "linear": "untuned"})
    table = capacity.accuracy_by_pairs(fixed)
    lr = dict(zip(table.frame["variant"], table.frame["lr"], strict=False))
    assert lr["full"] == "0.003" and lr[next(v for v in lr if v.startswith("linear"))] == (
        "0.001 (untuned)"
    )
    assert "untuned (no tuned rate): linear" in tuning.protocol_line(series.trained_quality(fixed))


# --- Mistakes on the command line: one line, no traceback, non-zero exit -----------------------


def _grid_csv(tmp_path):
    path = tmp_path / "results.csv"
    _grid_sweep(VALID, VALID, seeds=(0,)).drop(columns=["variant"]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("case", ["empty", "missing", "no grid"])
def test_a_sweep_with_nothing_to_tune_is_one_line(tmp_path, capsys, case):
    path = tmp_path / "sweep"
    if case != "missing":
        path.mkdir()
    if case == "no grid":
        (path / "0").mkdir()
        (path / "0" / "result.json").write_text(
            '{"config_hash": "a", "status": "ok", "attention": "full", "train.lr": 0.001}'
        )
    assert tuning.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(path) in err, err


def test_write_into_a_missing_folder_is_one_line_naming_the_option(tmp_path, capsys):
    target = tmp_path / "no" / "such" / "demo.yaml"
    assert tuning.main([str(_grid_csv(tmp_path)), "--write", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --write {target}: "), err
    assert not target.exists()


# --- a grid over the weight decay too (MAD's {0, 0.1}): its points are (lr, wd) pairs ---


def _lr_wd_sweep(valid) -> pd.DataFrame:
    """One job per (variant, lr, wd) at seed 0; valid: variant -> (lr, wd) -> accuracy."""
    rows = []
    for attention, points in valid.items():
        for (rate, decay), score in points.items():
            rows.append(
                {
                    "sweep": "grid",
                    "job": str(len(rows)),
                    "status": "ok",
                    "attention": attention,
                    "task": "listops",
                    "train.lr": rate,
                    "train.weight_decay": decay,
                    "train.steps": 600,
                    "seq_len": 64,
                    "seed": 0,
                    "valid_accuracy": score,
                    "eval_accuracy": score,
                    "learned": score >= 0.9,
                }
            )
    return load.tidy(pd.DataFrame(rows))


LR_WD = {
    "full": {(1e-3, 0.0): 0.5, (1e-3, 0.1): 0.6, (3e-3, 0.0): 0.97, (3e-3, 0.1): 0.99},
    "linear": {(1e-3, 0.0): 0.4, (1e-3, 0.1): 0.3, (3e-3, 0.0): 0.2, (3e-3, 0.1): 0.2},
}


def test_a_weight_decay_grid_is_chosen_with_the_rate_as_one_point():
    sweep = _lr_wd_sweep(LR_WD)
    context = series.context_columns(sweep)
    assert "train.weight_decay" not in context  # tuning, not a series of its own
    trained = series.trained_quality(sweep)
    chosen = trained.set_index("attention")[["lr_chosen", "wd_chosen"]].T.to_dict("list")
    assert chosen == {"full": [3e-3, 0.1], "linear": [1e-3, 0.0]}
    assert set(trained["lr_grid"]) == {"{0.001, 0.003} × wd {0, 0.1}"}
    assert tuning.lr_text(trained[trained["attention"] == "full"]) == "0.003, wd 0.1"
    assert "lr and weight decay per variant from {0.001, 0.003} × wd {0, 0.1}" in (
        tuning.protocol_line(trained)
    )
    rates = tuning.chosen_rates(sweep, context)
    assert set(rates["overrides"]) == {
        "attention=full train.lr=0.003 train.weight_decay=0.1",
        "attention=linear train.lr=0.001 train.weight_decay=0",
    }
    with pytest.raises(ValueError, match="learning rates only"):
        tuning.rate_table(rates, sweep, "multirun/mad")


def test_not_learned_at_the_chosen_point_names_its_weight_decay():
    points = {"linear": {(1e-3, 0.0): 0.4, (1e-3, 0.1): 0.95, (3e-3, 0.0): 0.2, (3e-3, 0.1): 0.2}}
    sweep = _lr_wd_sweep(points)
    sweep.loc[sweep["valid_accuracy"] == 0.95, ["valid_accuracy", "eval_accuracy"]] = 0.1
    sweep.loc[(sweep["train.lr"] == 1e-3) & (sweep["train.weight_decay"] == 0.1), "learned"] = True
    trained = accuracy.with_learned(series.trained_quality(sweep))
    assert (
        accuracy.not_learned_text(trained)
        == "not learned in 600 steps at lr 0.001, wd 0 (control 40.0%)"
    )


def test_a_family_that_swept_no_weight_decay_is_labelled_with_its_rates_alone():
    """Beside a sweep over (lr, wd), a family with one weight decay keeps an lr-only grid."""
    lr_only = _lr_wd_sweep({"lsh": {(1e-3, 0.01): 0.5, (3e-3, 0.01): 0.7}})
    both = pd.concat([_lr_wd_sweep(LR_WD), lr_only.assign(sweep="other")], ignore_index=True)
    trained = series.trained_quality(both)
    lsh = trained[trained["attention"] == "lsh"]
    assert set(lsh["lr_grid"]) == {"{0.001, 0.003}"} and lsh["wd_chosen"].isna().all()
    assert tuning.lr_text(lsh) == "0.003"
