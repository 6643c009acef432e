"""Curriculum stages: the schedule, equal tokens per step, one record per stage."""

from __future__ import annotations

import copy
import json

import pytest

from experiments.app.job import run_job
from experiments.job_config import JobConfig, JobIdentity
from experiments.measurement import measure
from experiments.records import record, store
from experiments.training import curriculum, stages
from tests.experiments import conftest

TINY = (
    "seq_len=64",
    "batch_size=2",
    "task=long_recall",
    "task.n_pairs=2",
    "task.n_keys=4",
    "task.n_values=4",
    *conftest.TINY,
    "train.eval_every=0",
    "train.eval_batches=1",
    *conftest.MEASURE_NOTHING,
    "logger=none",
)
SCHEDULE = "train.curriculum=[{seq_len:16,steps:3},{seq_len:32,steps:1}]"


def test_without_a_curriculum_the_job_is_its_only_stage(job_config):
    assert job_config(*TINY).stages == (curriculum.Stage(64, 2, 2),)


def test_stages_keep_the_tokens_per_step_and_end_with_the_job(resolved_config):
    config = resolved_config(*TINY, SCHEDULE)
    job = JobConfig.of(config)
    assert job.stages == (
        curriculum.Stage(16, 8, 3),
        curriculum.Stage(32, 4, 1),
        curriculum.Stage(64, 2, 2),
    )
    staged = job.at_stage(job.stages[0])
    assert (staged.seq_len, staged.batch_size, staged.train) == (16, 8, job.train)
    identity = JobIdentity(config)
    staged_identity = identity.at(job.stages[0])
    # Recorded as the job's config with only seq_len and batch_size changed (edited by hand).
    expected = copy.deepcopy(config)
    expected["seq_len"], expected["batch_size"] = 16, 8
    assert staged_identity.columns == record.config_columns(expected)
    assert staged_identity.config_hash == record.config_hash(expected) != identity.config_hash
    assert staged.stages == (curriculum.Stage(16, 8, 2),)  # as a job of that record would run
    assert config["seq_len"] == 64 and job.seq_len == 64  # the job's config is left as it was
    assert identity.config_hash == record.config_hash(config)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("[{seq_len:32,steps:1},{seq_len:16,steps:1}]", r"\[1\].seq_len'=16 must be longer"),
        ("[{seq_len:16}]", r"train.curriculum\[0\]' must be \{seq_len"),
        ("[{seq_len:16,steps:-1}]", r"\[0\].steps' must be a non-negative"),
        ("[{seq_len:0,steps:1}]", r"\[0\].seq_len' must be a positive"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_entry(job_config, schedule, message):
    with pytest.raises(ValueError, match=message):
        job_config(*TINY, f"train.curriculum={schedule}")


def test_the_model_trains_through_every_stage_and_reports_each(job_config):
    config = job_config(*TINY, SCHEDULE)
    steps, stages = [], []
    columns = measure.measure(
        config,
        measure.setup(config),
        on_step=lambda metrics, step: steps.append((step, metrics.get("train/seq_len"))),
        on_stage=lambda stage, cols: stages.append((stage, cols)),
    )
    assert [s for s, _ in steps] == list(range(6))  # one step axis across the stages
    assert [length for _, length in steps] == [16, 16, 16, 32, 64, 64]
    assert [stage.seq_len for stage, _ in stages] == [16, 32]
    for number, (_, cols) in enumerate(stages):
        assert cols["curriculum_stage"] == number and 0 <= cols["eval_accuracy"] <= 1
    assert [cols["trained_steps"] for _, cols in stages] == [3, 4]
    assert columns["curriculum_stage"] == 2 and columns["trained_steps"] == 6


def test_each_stage_is_recorded_as_its_own_configuration(resolved_config, tmp_path):
    config = resolved_config(*TINY, SCHEDULE)
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    paths = sorted((tmp_path / "0" / "stages").glob("*/result.json"))
    assert [p.parent.name for p in paths] == ["16", "32"]
    stage_records = [json.loads(p.read_text()) for p in paths]
    assert [(r["seq_len"], r["batch_size"], r["job"]) for r in stage_records] == [
        (16, 8, "0/16"),
        (32, 4, "0/32"),
    ]
    hashes = {r["config_hash"] for r in stage_records} | {rec["config_hash"]}
    assert len(hashes) == 3 and all(r["status"] == "ok" for r in stage_records)
    assert all(r["attention"] == rec["attention"] and r["git_commit"] for r in stage_records)
    gathered = store.gather(tmp_path)
    assert sorted(gathered["seq_len"]) == [16, 32, 64]


def test_a_displaced_job_takes_its_stage_records_with_it(resolved_config, tmp_path):
    """Scenario 1: sweep seed=0,1 with a curriculum, re-run as seed=2,0 into the same dir. Job
    0's record moved to `displaced/` but its stage record was overwritten: 6 configurations
    measured, 5 in results.csv. Now the stages move with their job's record."""
    sweep_dir, schedule = tmp_path / "sweep", "train.curriculum=[{seq_len:32,steps:1}]"
    first = resolved_config(*TINY, schedule, "train.steps=1", "seed=0")
    rec0 = run_job(first, sweep_dir / "0", job="0", sweep_dir=sweep_dir)
    stage0 = json.loads((sweep_dir / "0" / "stages" / "32" / "result.json").read_text())
    second = resolved_config(*TINY, schedule, "train.steps=1", "seed=2")
    rec2 = run_job(second, sweep_dir / "0", job="0", sweep_dir=sweep_dir)
    moved = sweep_dir / "0" / "displaced" / rec0["config_hash"]
    assert json.loads((moved / "result.json").read_text()) == rec0
    assert json.loads((moved / "stages" / "32" / "result.json").read_text()) == stage0
    gathered = store.gather(sweep_dir)
    assert len(gathered) == 4 and set(gathered["status"]) == {"ok"}
    assert {rec0["config_hash"], rec2["config_hash"], stage0["config_hash"]} <= set(
        gathered["config_hash"]
    )
    # Resume still finds the displaced configuration: it is not measured again.
    assert run_job(first, sweep_dir / "1", job="1", sweep_dir=sweep_dir) is None


def test_a_stage_record_of_another_configuration_is_displaced_not_overwritten(
    resolved_config, tmp_path
):
    """A job dir whose own record was lost keeps its stage records: a stage of another
    configuration at the same length moves to `displaced/` beside it."""
    schedule = "train.curriculum=[{seq_len:32,steps:1}]"
    first = resolved_config(*TINY, schedule, "train.steps=1", "seed=0")
    run_job(first, tmp_path / "0", job="0", sweep_dir=None)
    stage_path = tmp_path / "0" / "stages" / "32" / "result.json"
    stage0 = json.loads(stage_path.read_text())
    (tmp_path / "0" / "result.json").unlink()  # e.g. killed before its last stage ended
    run_job(
        resolved_config(*TINY, schedule, "train.steps=1", "seed=1"),
        tmp_path / "0",
        job="0",
        sweep_dir=None,
    )
    moved = stage_path.parent / "displaced" / stage0["config_hash"] / "result.json"
    assert json.loads(moved.read_text()) == stage0
    assert json.loads(stage_path.read_text())["config_hash"] != stage0["config_hash"]


def test_a_job_shorter_than_the_schedule_takes_the_stages_below_it_and_says_so(job_config):
    config = job_config(
        *TINY, "train.curriculum=[{seq_len:16,steps:3},{seq_len:64,steps:1},{seq_len:128,steps:1}]"
    )
    assert config.stages == (curriculum.Stage(16, 8, 3), curriculum.Stage(64, 2, 2))
    assert config.skipped_note() == (
        "train.curriculum: stages at seq_len 64, 128 are not shorter than seq_len=64 and are "
        "left out; training 16 -> 64"
    )
    assert job_config(*TINY, SCHEDULE).skipped_note() is None


def test_the_long_range_preset_runs_at_a_shorter_length(job_config):
    config = job_config("+experiment=long_range", "seq_len=1024", "attention=full")
    assert [stage.seq_len for stage in config.stages] == [64, 128, 256, 512, 1024]
    assert "stages at seq_len 1024 are not shorter" in config.skipped_note()


def test_the_stages_share_one_optimizer_whose_step_count_carries_over(job_config, monkeypatch):
    from experiments.training import train as train_module

    runs = []
    real = train_module.train

    def spy(*args, run=None, **kwargs):
        runs.append((run, None if run is None else run.step))
        return real(*args, run=run, **kwargs)

    monkeypatch.setattr(stages, "train", spy)
    config = job_config(*TINY, SCHEDULE)
    measure.measure(config, measure.setup(config))
    assert len({id(r) for r, _ in runs}) == 1 and runs[0][0] is not None
    assert [step for _, step in runs] == [0, 3, 4]  # each stage continues the count
    optimizer = runs[0][0].optimizer
    assert int(optimizer.state[optimizer.param_groups[0]["params"][0]]["step"]) == 6


def test_a_re_measure_keeps_the_ok_stage_records_aside(resolved_config, tmp_path, monkeypatch):
    """resume=false over a curriculum job: the old record moves aside with its stages, the
    new stages are written in their place (none of either is lost)."""
    sweep_dir, out_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    schedule = ("train.curriculum=[{seq_len:32,steps:1}]", "train.steps=1", "resume=false")
    config = resolved_config(*TINY, *schedule)
    first = run_job(config, out_dir, job="0", sweep_dir=sweep_dir)
    stage = json.loads((out_dir / "stages" / "32" / "result.json").read_text())
    second = run_job(config, out_dir, job="0", sweep_dir=sweep_dir)
    kept = out_dir / "displaced" / first["config_hash"]
    assert json.loads((kept / "result.json").read_text()) == first
    assert json.loads((kept / "stages" / "32" / "result.json").read_text()) == stage
    new_stage = json.loads((out_dir / "stages" / "32" / "result.json").read_text())
    assert new_stage["config_hash"] == stage["config_hash"] and new_stage != stage
    assert json.loads((out_dir / "result.json").read_text()) == second
    assert len(store.read_records(sweep_dir)[0]) == 4 and len(store.gather(sweep_dir)) == 2
