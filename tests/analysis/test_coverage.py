"""Not learned, against a covering pattern: each not-learned row's sentence from the probes of
the same variant and protocol, and the committed snapshot against the preset."""

from __future__ import annotations

import pandas as pd
from omegaconf import OmegaConf

from analysis import capacity, coverage, load, not_learned, trained_quality
from tests.experiments.conftest import CONF

CURRICULUM = '[{"seq_len": 64, "steps": 1000}]'


def job(sweep, number, attention, options, accuracy, *, learned_at=None, lr=0.003, steps=150):
    """A long-range job's two records (its 64-token control and its 1024 stage)."""
    rows = []
    for length, value in zip((64, 1024), accuracy, strict=True):
        rows.append(
            {
                "sweep": sweep,
                "job": str(number) if length == 1024 else f"{number}/64",
                "status": "ok",
                "attention": attention,
                **{f"attention.{k}": v for k, v in options.items()},
                "task": "long_recall",
                "task.name": "long_recall",
                "task.n_values": 32,
                "train.curriculum": CURRICULUM,
                "train.steps": steps,
                "train.lr": lr,
                "seq_len": length,
                "d_model": 64,
                "n_heads": 2,
                "seed": 0,
                "eval_accuracy": value,
                "trained_steps": 1000 if length == 64 else 1150,
                "learned": learned_at is not None,
                "steps_to_learn": learned_at,
                "job_seconds": 60.0,
                "git_commit": "abcdef0123",
            }
        )
    return rows


def frame(*jobs) -> pd.DataFrame:
    return load.tidy(pd.DataFrame([row for rows in jobs for row in rows]))


ROWS = frame(
    job("long_range_quick", 0, "full", {"impl": "sdpa"}, (1.0, 0.99), learned_at=450),
    job("long_range_quick", 1, "linformer", {"k": 256, "share": "none"}, (0.06, 0.03)),
    job("long_range_quick", 2, "strided", {"stride": "auto"}, (0.18, 0.04)),
    job("long_range_quick", 3, "performer", {"n_features": None}, (0.08, 0.07)),
)
PROBES = frame(
    job("coverage_probes", 0, "linformer", {"k": 256, "init": "identity"}, (0.09, 0.03)),
    job(
        "coverage_probes",
        1,
        "linformer",
        {"k": 256, "init": "identity", "learn_projection": False},
        (0.999, 0.04),
        learned_at=300,
    ),
    job("coverage_probes", 2, "strided", {"stride": 64}, (0.993, 0.03), learned_at=250),
)


def rows_sentences(rows=ROWS, probes=PROBES):
    from analysis import accuracy

    return coverage.sentences(
        accuracy.with_learned(rows), ["attention"], coverage.probe_jobs(probes)
    )


def test_a_row_whose_covered_probe_learned_names_what_did_not():
    text = next(s for s in rows_sentences() if s.startswith("strided"))
    assert text == (
        "strided: not learned; stride auto → 64 (lr 0.003): learned by step 250: 99.3 % at 64 "
        "tokens → what did not learn is strided with stride auto, a property of the method here."
    )


def test_every_probe_of_a_row_is_cited_and_the_one_that_learned_reads_it():
    text = next(s for s in rows_sentences() if s.startswith("linformer"))
    assert "init xavier → identity (lr 0.003): not learned in 1150 steps (9.0 % at 64" in text
    assert (
        "init xavier → identity, learn_projection True → False (lr 0.003): learned by step " in text
    )
    assert text.endswith(
        "→ what did not learn is linformer with init xavier, learn_projection True, a property of "
        "the method here."
    )


def test_a_probe_that_did_not_learn_leaves_the_cause_open():
    only = PROBES[PROBES["job"].map(lambda j: not str(j).startswith("1"))]
    text = next(s for s in rows_sentences(probes=only) if s.startswith("linformer"))
    assert text.endswith("→ the cause is not what the probes changed (open).")


def test_a_row_without_a_probe_says_so_and_learned_rows_have_none():
    lines = rows_sentences()
    assert "performer: not learned; no covering probe on this protocol." in lines
    assert not [s for s in lines if s.startswith("full")]


def test_a_probe_on_another_protocol_is_not_a_rows():
    other = PROBES.assign(**{"train.steps": 999})
    assert "strided: not learned; no covering probe on this protocol." in rows_sentences(
        probes=other
    )


def test_the_length_table_note_has_the_sentences_only_on_a_probed_protocol(monkeypatch):
    monkeypatch.setattr(coverage, "probe_records", lambda frame=None, snapshot=None: PROBES)
    note = trained_quality.quality_by_length(ROWS).note
    assert "Not learned, against a covering pattern" in note
    assert "strided: not learned; stride auto → 64" in note
    elsewhere = ROWS.assign(**{"train.steps": 7})
    assert "covering pattern" not in trained_quality.quality_by_length(elsewhere).note


def test_a_capacity_probe_reads_its_fewest_and_most_pairs():
    rows = []
    for pairs, value in ((4, 0.999), (16, 0.99), (64, 0.97)):
        rows.append(
            {
                "sweep": "coverage_probes",
                "job": "4" if pairs == 4 else f"4/n_pairs={pairs}",
                "status": "ok",
                "attention": "moba",
                "attention.top_k": 16,
                "task": "recall",
                "task.n_pairs": pairs,
                "seq_len": 256,
                "d_model": 64,
                "n_heads": 4,
                "eval_accuracy": value,
                "trained_steps": 800,
                "learned": True,
                "steps_to_learn": 750,
            }
        )
    (probe,) = coverage.probe_jobs(load.tidy(pd.DataFrame(rows))).to_dict("records")
    assert probe["result"] == "learned by step 750: 99.9 / 97.0 % at 4 / 64 pairs"
    assert probe["head_dim"] == 16


def test_the_capacity_table_reads_the_probes_beside_it():
    from tests.analysis.test_capacity import _mixture_sweep

    sweep = _mixture_sweep().assign(**{"train.curriculum": "[]", "task.name": "recall"})
    probe = sweep[sweep["attention"] == "performer"].assign(
        sweep="coverage_probes", eval_accuracy=0.99, learned=True, steps_to_learn=300
    )
    probe = probe.assign(**{"attention.n_features": 256})
    table = capacity.capacity(pd.concat([sweep, probe], ignore_index=True))
    assert "performer at head dim 16: not learned; n_features default → 256: learned" in table.note
    assert "learned by step 300: 99.0 / 99.0 % at 4 / 64 pairs" in table.note


def test_a_probe_at_another_rate_than_the_rows_says_both():
    slower = PROBES.assign(**{"train.lr": 0.01})
    text = next(s for s in rows_sentences(probes=slower) if s.startswith("strided"))
    assert "stride auto → 64 (lr 0.01, the row's 0.003): learned by step 250" in text


def test_the_snapshot_holds_one_job_per_probe_of_the_preset():
    """docs/results/coverage_probes.csv is the preset's measured records: a job per probe file, each
    of that file's variant."""
    names = sorted(
        _variant_of(path) for path in (CONF / "experiment" / "coverage_probes").glob("*.yaml")
    )
    jobs = coverage.probe_jobs(coverage.probe_records())
    assert sorted(jobs["attention"]) == names
    assert jobs["result"].str.len().gt(0).all()


def _variant_of(path) -> str:
    """The variant a probe file runs: its `override /attention:` default (moba_small is moba)."""
    for entry in OmegaConf.to_container(OmegaConf.load(path))["defaults"]:
        if isinstance(entry, dict) and "override /attention" in entry:
            setting = entry["override /attention"]
            return OmegaConf.load(CONF / "attention" / f"{setting}.yaml")["name"]
    raise AssertionError(f"{path}: no override of /attention")


def test_the_command_prints_a_sentence_per_not_learned_row(tmp_path, capsys):
    ROWS.to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "probes").mkdir()
    PROBES.to_csv(tmp_path / "probes" / "results.csv", index=False)
    not_learned.main([str(tmp_path / "rows.csv"), "--probes", str(tmp_path / "probes")])
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [
        "- linformer",
        "- performer",
        "- strided",
    ]
    not_learned.main(["--probes", str(tmp_path / "probes")])
    assert "| strided | stride 64 | long_recall (64, 1024) |" in capsys.readouterr().out
