"""The runner through its CLI: real Hydra sweeps in subprocesses, read back from disk and W&B.

Every sweep measures a tiny configuration (d_model 32, seq_len 64, 2 training steps) so a job
takes about a second; what is checked is the plumbing: records, the results store, resume, the
W&B runs, failures as data, and the messages of bad single runs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.app import tracking
from experiments.records import history, record
from experiments.records.record import flatten
from tests import wandb_runs
from tests.experiments.conftest import CONF, MEASURE_NOTHING

IDENTITY = ("sweep", "job", "config_hash", "status", "error")
CONFIGURATION = (
    "attention",
    "attention.name",
    "block",
    "task",
    "seq_len",
    "batch_size",
    "d_model",
    "n_heads",
    "depth",
    "causal",
    "dtype",
    "seed",
    "device",
    "threads",
)
# Measurements of an ok job on the random-token task, each a positive number.
MEASUREMENTS = (
    "attn_fwd_ms",
    "attn_fwd_bwd_ms",
    "step_ms",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "attn_fwd_flops",
    "attn_fwd_bwd_flops",
    "attn_fwd_gflops_per_s",
    "attn_fwd_bwd_gflops_per_s",
    "matmul_peak_gflops_per_s",
    "train_loss",
    "eval_loss",
    "tokens_per_s",
    "n_parameters",
    "job_seconds",
)
SPREADS = ("attn_fwd_iqr_ms", "attn_fwd_bwd_iqr_ms", "step_iqr_ms", "approx_rel_error")  # >= 0
PROVENANCE = (
    "git_commit",
    "torch_version",
    "device_name",
    "hostname",
    "timestamp",
    "thp_mem_alloc",
    "offline_run_dir",
)
SKIP_MESSAGE = "already recorded with status ok"  # logged by a job that resume skips
RAN_MESSAGE = "record: "  # printed by a job that measured and recorded
# Resume is about which jobs run, not what they measure: time only the machine's matmul rate.
QUICK = ("logger=none", "train.steps=0", *MEASURE_NOTHING)
# A CLI sweep of QUICK jobs whose test reads only records and results.csv: no report drawn at its
# end (test_ctrl_c_... and tests/analysis/test_sweep_report.py check the report of a sweep).
BOOKKEEPING = (*QUICK, "report=false")


def job_records(sweep_dir: Path) -> dict[str, dict]:
    """{job dir name: record} of every `<sweep_dir>/<job>/result.json`."""
    paths = sorted(sweep_dir.glob("*/result.json"))
    return {p.parent.name: json.loads(p.read_text()) for p in paths}


def by_seq_len(sweep_dir: Path) -> dict[int, dict]:
    """{seq_len: record} of a sweep's job dirs, each asserted to be named by its record."""
    records = job_records(sweep_dir)
    for job, rec in records.items():
        assert job == f"{rec['attention']}-L{rec['seq_len']}-{rec['config_hash']}" == rec["job"]
    return {rec["seq_len"]: rec for rec in records.values()}


def record_mtimes(sweep_dir: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("*/result.json")}


def results_csv(sweep_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(sweep_dir / "results.csv")
    assert frame["config_hash"].is_unique, frame[["config_hash", "job", "status"]]
    return frame


def assert_ran(done: subprocess.CompletedProcess, *, ran: int, skipped: int) -> None:
    """The multirun measured `ran` jobs and resume skipped `skipped` (from its stdout)."""
    assert (done.stdout.count(RAN_MESSAGE), done.stdout.count(SKIP_MESSAGE)) == (ran, skipped), (
        done.stdout[-3000:]
    )


# --- A sweep with W&B offline -----------------------------------------------------------------


@pytest.fixture(scope="module")
def wandb_sweep(module_cli, tmp_path_factory) -> Path:
    """Two measured variants and linformer, which cannot be causal, with the default logger."""
    sweep_dir = tmp_path_factory.mktemp("wandb") / "sweep"
    module_cli.sweep(
        sweep_dir, "attention=full,blockwise,linformer", "model.causal=true", "sweep=runner-test"
    )
    return sweep_dir


def ok_records(sweep_dir: Path) -> dict[str, dict]:
    records = job_records(sweep_dir)
    assert sorted(job.split("-")[0] for job in records) == ["blockwise", "full", "linformer"]
    return {job: rec for job, rec in records.items() if rec["attention"] != "linformer"}


@pytest.mark.slow
def test_sweep_records_have_every_documented_column(wandb_sweep):
    records = ok_records(wandb_sweep)
    assert sorted(r["attention"] for r in records.values()) == ["blockwise", "full"]
    for job, rec in records.items():
        assert rec["status"] == "ok" and rec["error"] is None, rec["error"]
        missing = [
            c
            for c in (*IDENTITY, *CONFIGURATION, *MEASUREMENTS, *SPREADS, *PROVENANCE)
            if c not in rec
        ]
        assert not missing, f"job {job} lacks {missing}"
        for column in MEASUREMENTS:
            value = rec[column]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, column
        assert all(rec[c] >= 0 for c in SPREADS)
        assert isinstance(rec["peak_memory_bytes"], int)
        identity = (rec["sweep"], rec["job"], rec["seq_len"], rec["d_model"], rec["causal"])
        assert identity == ("runner-test", job, 64, 32, True)
        assert rec["eval_accuracy"] is None  # random tokens: no accuracy to report
        assert rec["device"] == "cpu" and rec["threads"] == 1
    full = next(r for r in records.values() if r["attention"] == "full")
    assert full["approx_rel_error"] < 1e-6  # exact attention against itself


@pytest.mark.slow
def test_unsupported_combination_is_skipped_and_the_rest_succeed(wandb_sweep):
    records = job_records(wandb_sweep)
    (linformer,) = [r for r in records.values() if r["attention"] == "linformer"]
    assert linformer["status"] == "skipped"
    assert "linformer" in linformer["error"] and "causal" in linformer["error"]
    assert "attn_fwd_ms" not in linformer and linformer["causal"] is True
    assert (linformer["device"], linformer["threads"]) == ("cpu", 1)  # resolved, as measured
    assert all(r["status"] == "ok" for r in records.values() if r is not linformer)
    # Nothing was measured, so nothing is tracked: no W&B run piles up at each re-run.
    assert linformer["offline_run_dir"] is None
    assert not wandb_runs.find(wandb_sweep / linformer["job"])


@pytest.mark.slow
def test_sweep_is_gathered_into_csv_and_parquet(wandb_sweep):
    records = job_records(wandb_sweep)
    csv, parquet = results_csv(wandb_sweep), pd.read_parquet(wandb_sweep / "results.parquet")
    assert len(csv) == len(parquet) == 3
    hashes = {r["config_hash"] for r in records.values()}
    assert set(csv["config_hash"]) == set(parquet["config_hash"]) == hashes
    assert sorted(csv["status"]) == ["ok", "ok", "skipped"]
    ok = csv[csv["status"] == "ok"].set_index("config_hash")
    for rec in ok_records(wandb_sweep).values():
        assert ok.loc[rec["config_hash"], "attn_fwd_ms"] == pytest.approx(rec["attn_fwd_ms"])


@pytest.mark.slow
def test_offline_wandb_runs_hold_the_same_config_and_summary(wandb_sweep):
    for job, rec in ok_records(wandb_sweep).items():
        run = wandb_runs.read(Path(rec["offline_run_dir"]))
        hydra_config = OmegaConf.load(wandb_sweep / job / ".hydra" / "config.yaml")
        assert run["config"] == OmegaConf.to_container(hydra_config, resolve=True)
        assert run["config"]["attention"]["name"] == rec["attention"]
        assert run["config"]["seq_len"] == rec["seq_len"] == 64
        flat = flatten(run["config"])
        config_columns = {k: v for k, v in rec.items() if "." in k}  # e.g. attention.block_size
        assert {k: flat[k] for k in config_columns} == config_columns
        # The summary carries every measured column of the record (W&B keeps no None values);
        # the configuration is the run's config, never copied into its summary.
        configuration = {
            *record.config_keys(rec),
            *record.ALIASES.values(),
            *record.RESOLVED.values(),
        }
        expected = {
            k: v
            for k, v in rec.items()
            if v is not None and k != "offline_run_dir" and k not in configuration
        }
        assert {k: run["summary"].get(k) for k in expected} == expected
        assert not {"attention", "block", "model.depth"} & set(run["summary"])
        assert run["group"] == "runner-test"
        assert run["name"] == tracking.run_name(rec, rec["config_hash"])
        token = (wandb_sweep / ".sweep_id").read_text().strip()  # the sweep dir's identity
        assert run["run_id"] == f"runner-test-{token}-{rec['config_hash']}"  # same at re-runs
        assert run["exit_code"] == 0
        assert [row["step"] for row in run["history"] if "train/loss" in row] == [0, 1]
        steps = history.read(wandb_sweep / job / history.FILE)  # the same curve, kept locally
        assert steps[steps["metric"] == "train/loss"]["step"].tolist() == [0, 1]
    summary_runs = wandb_runs.find(wandb_sweep / "wandb")
    assert [wandb_runs.read(r)["job_type"] for r in summary_runs] == ["sweep-summary"]


# --- Resume -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_sweep_resumes_with_only_the_missing_jobs(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = cli.sweep_args(sweep_dir, "seq_len=64,96,128", *BOOKKEEPING)
    process = cli.start(*command)
    deadline = time.monotonic() + 240
    while not list(sweep_dir.glob("*/result.json")):  # kill right after the first record
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.02)
    process.kill()
    process.communicate()
    before = record_mtimes(sweep_dir)
    assert 1 <= len(before) < 3

    done = cli.run(*command)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_ran(done, ran=3 - len(before), skipped=len(before))
    assert {job: record_mtimes(sweep_dir)[job] for job in before} == before
    assert sorted(results_csv(sweep_dir)["seq_len"]) == [64, 96, 128]

    # Extend the sweep after losing one record and failing another, with a value inserted
    # first and one appended: the lost, the failed and the two new configurations are
    # measured, each in its own dir; the one still recorded ok is not, and its record stays.
    jobs = {rec["seq_len"]: job for job, rec in job_records(sweep_dir).items()}
    (sweep_dir / jobs[96] / "result.json").unlink()
    failed = sweep_dir / jobs[128] / "result.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "error"}))
    before = record_mtimes(sweep_dir)
    done = cli.sweep(sweep_dir, "seq_len=32,64,96,128,160", *BOOKKEEPING)
    assert_ran(done, ran=4, skipped=1)
    assert record_mtimes(sweep_dir)[jobs[64]] == before[jobs[64]]
    records = by_seq_len(sweep_dir)
    assert sorted(records) == [32, 64, 96, 128, 160]
    assert {records[n]["job"] for n in (64, 96, 128)} == {jobs[64], jobs[96], jobs[128]}
    assert not list(sweep_dir.glob("**/displaced"))
    frame = results_csv(sweep_dir)
    assert sorted(frame["seq_len"]) == [32, 64, 96, 128, 160] and set(frame["status"]) == {"ok"}


def test_a_rerun_with_one_more_configuration_leaves_every_dir_its_configuration(cli, tmp_path):
    """Job dirs are named by configuration (`experiments/app/job_dirs.py`): a sweep of two
    lengths re-run with a third inserted first measures the new one in a dir of its own, and
    each earlier dir holds the configuration it held (with numbered dirs the inserted value
    took dir 0 and moved its record to `0/displaced/`)."""
    sweep_dir = tmp_path / "sweep"
    cli.sweep(sweep_dir, "seq_len=64,96", *BOOKKEEPING)
    first = job_records(sweep_dir)
    assert sorted(rec["seq_len"] for rec in first.values()) == [64, 96]
    done = cli.sweep(sweep_dir, "seq_len=32,64,96", *BOOKKEEPING)
    assert_ran(done, ran=1, skipped=2)
    again = job_records(sweep_dir)
    assert {job: again[job] for job in first} == first  # each dir: the same record
    assert sorted(rec["seq_len"] for rec in again.values()) == [32, 64, 96]
    assert set(by_seq_len(sweep_dir)) == {32, 64, 96}  # each dir named by its record
    assert not list(sweep_dir.glob("**/displaced"))


def test_a_second_multirun_with_its_own_subdirs_records_jobs_by_their_dir(cli, tmp_path):
    """A subdir named on the command line wins over the configuration's name; job numbers
    restart at 0 in every multirun, and the jobs are named by their dirs, so no two jobs of
    the sweep share a name (analysis tells a job's records apart by it)."""
    sweep_dir = tmp_path / "sweep"
    assert cli.sweep(sweep_dir, "seq_len=64,96", *BOOKKEEPING).returncode == 0
    done = cli.sweep(
        sweep_dir, "seq_len=128", "hydra.sweep.subdir=more-${hydra.job.num}", *BOOKKEEPING
    )
    assert done.returncode == 0, done.stderr[-3000:]
    named = {job: rec["seq_len"] for job, rec in job_records(sweep_dir).items()}
    assert named.pop("more-0") == 128 and sorted(named.values()) == [64, 96]
    assert sorted(results_csv(sweep_dir)["job"].map(str)) == sorted(["more-0", *named])


# --- Tuned learning rates ----------------------------------------------------------------------


@pytest.fixture
def tuned_table(tmp_path):
    """A table in conf/tuned/ (where `${tuned_lr:...}` reads), removed after the test."""
    path = CONF / "tuned" / f"test-{tmp_path.name}.yaml"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_variant_missing_from_its_tuned_table_trains_untuned_and_is_recorded(
    cli, tmp_path, tuned_table
):
    """A missing entry arrived inside a Hydra traceback: no record for that job, and the
    "did not end ok" table was not printed."""
    tuned_table.write_text("full: 3.0e-3\n")
    sweep_dir = tmp_path / "sweep"
    lr = f"train.lr='${{tuned_lr:{tuned_table.stem},${{attention.name}}}}'"
    done = cli.sweep(sweep_dir, "attention=full,linear", lr, *BOOKKEEPING)
    assert "Traceback" not in done.stderr
    said = f"{tuned_table.stem}.yaml has no usable rate for attention 'linear'"
    assert said in done.stdout + done.stderr
    records = {r["attention"]: r for r in job_records(sweep_dir).values()}
    assert {a: (r["status"], r["train.lr"], r["lr_source"]) for a, r in records.items()} == {
        "full": ("ok", 3e-3, "tuned"),
        "linear": ("ok", 1e-3, "untuned"),
    }
    assert "lr_source" in done.stdout  # it varies: the sweep's table shows it
    tuned_table.write_text("full: 3.0e-3\nlinear: fast\n")
    damaged = cli.run(*cli.sweep_args(tmp_path / "again", "attention=full", lr, *BOOKKEEPING))
    lines = [line for line in damaged.stderr.splitlines() if line.startswith("error")]
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr, damaged.stderr
    assert lines == [
        f"error: config: tuned_lr: {tuned_table}: 'linear': 'fast' is not a positive learning "
        "rate (or null: no usable rate)"
    ]


# --- Failures are data ------------------------------------------------------------------------


@pytest.mark.slow
def test_oom_under_a_memory_cap_is_recorded_and_the_sweep_goes_on(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # Explicit 8192 x 8192 float32 scores are 512 MiB per head, over a 0.3 GiB cap; the OOM job
    # runs first, so the second also shows that the cap was lifted after it.
    cli.sweep(
        sweep_dir,
        "attention.impl=math",
        "seq_len=8192,64",
        "budget.max_memory_gb=0.3",
        "logger=none",
    )
    records = by_seq_len(sweep_dir)
    assert records[8192]["status"] == "oom" and "memory" in records[8192]["error"].lower()
    assert "attn_fwd_ms" not in records[8192]
    assert records[64]["status"] == "ok", records[64]["error"]
    assert sorted(results_csv(sweep_dir)["status"]) == ["ok", "oom"]


# --- How a sweep ends -------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_with_an_invalid_option_lists_what_did_not_end_ok_and_exits_1(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # n_hashes=0 is invalid (error); LSH without shared QK is a valid but unsupported
    # combination (skipped); one configuration is measured.
    done = cli.run(
        *cli.sweep_args(
            sweep_dir,
            "attention=lsh",
            "attention.n_hashes=0,1",
            "model.shared_qk=null,false",
            *BOOKKEEPING,
        )
    )
    assert done.returncode == 1, done.stderr[-3000:]
    statuses = {
        (r["attention.n_hashes"], r["shared_qk"]): r["status"]
        for r in job_records(sweep_dir).values()
    }
    assert statuses == {
        (0, True): "error",
        (0, False): "skipped",
        (1, True): "ok",
        (1, False): "skipped",
    }
    table = done.stdout[done.stdout.index("3 job(s) of this multirun did not end ok:") :]
    header, *rows = table.splitlines()[1:5]
    assert header.split()[:2] == ["job", "status"] and header.split()[-1] == "reason"
    assert {"n_hashes", "shared_qk"} <= set(header.split())  # the keys that vary
    jobs = {r["job"]: r["status"] for r in job_records(sweep_dir).values() if r["status"] != "ok"}
    assert {row.split()[0]: row.split()[1] for row in rows} == jobs  # by dir name
    assert sorted(jobs.values()) == ["error", "skipped", "skipped"]
    (error,) = [row for row in rows if row.split()[1] == "error"]
    assert "'n_hashes' must be a positive integer, got 0" in error
    skips = [row for row in rows if row.split()[1] == "skipped"]
    assert any("requires option 'shared_qk'=True" in row for row in skips)
    assert "error: 1 error in this sweep" in done.stderr


@pytest.mark.slow
def test_ctrl_c_keeps_what_finished_and_leaves_no_run_of_the_interrupted_job(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # The second job trains for as long as it takes Ctrl-C to arrive; W&B is on (offline).
    process = cli.start(
        *cli.sweep_args(sweep_dir, "train.steps=1,100000", *MEASURE_NOTHING), new_session=True
    )
    deadline = time.monotonic() + 240

    def first_recorded() -> bool:
        found = list(sweep_dir.glob("*/result.json"))
        return bool(found) and bool(json.loads(found[0].read_text() or "{}").get("offline_run_dir"))

    while not first_recorded():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.05)
    (first,) = sweep_dir.glob("*/result.json")
    while len(list(sweep_dir.glob("*/.hydra"))) < 2:  # the second job has started
        time.sleep(0.05)
    (second,) = [p.parent for p in sweep_dir.glob("*/.hydra") if p.parent != first.parent]
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole process group
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stdout + stderr and "interrupted" in stderr
    assert list(results_csv(sweep_dir)["train.steps"]) == [1]
    assert "; 1 records (1 ok)" in (sweep_dir / "report" / "report.md").read_text()
    # The finished job's run and the summary run; the interrupted job's run was deleted, so a
    # re-run leaves no failed run beside the good one (re-runs replace runs: test_tracking.py).
    runs = [wandb_runs.read(r) for r in wandb_runs.find(sweep_dir)]
    assert sorted(r["job_type"] for r in runs) == ["full-residual", "sweep-summary"]
    assert not wandb_runs.find(second)


# --- Launchers --------------------------------------------------------------------------------


@pytest.mark.slow
def test_submitit_local_launch_records_and_gathers(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    # What a job measures is the same under every launcher: QUICK jobs, to see them launched,
    # recorded and gathered.
    cli.sweep(sweep_dir, "hydra/launcher=submitit_local", "attention=full,blockwise", *BOOKKEEPING)
    records = job_records(sweep_dir)
    assert sorted(job.split("-")[0] for job in records) == ["blockwise", "full"]
    assert [r["status"] for r in records.values()] == ["ok", "ok"]
    assert (sweep_dir / ".submitit").is_dir()  # the jobs really went through submitit
    assert sorted(results_csv(sweep_dir)["attention"]) == ["blockwise", "full"]


# --- Single runs: exit code and message -------------------------------------------------------

# name -> (overrides, words the one-line message on stderr must contain)
BAD_RUNS = {
    "heads_not_dividing_d_model": (["model.n_heads=3"], ["d_model", "n_heads", "divisible"]),
    "zero_seq_len": (["seq_len=0"], ["seq_len", "positive"]),
    "zero_depth": (["model.depth=0"], ["depth", "positive"]),
    "unknown_variant": (
        ["attention.name=nope"],
        ["unknown attention variant 'nope'", "available:", "full", "lsh"],
    ),
    "causal_linformer": (["attention=linformer", "model.causal=true"], ["linformer", "causal"]),
    "unknown_top_level_key": (["+seqlen=128"], ["'seqlen'", "did you mean 'seq_len'?"]),
    "negative_block_size": (
        ["attention=blockwise", "attention.block_size=-1"],
        ["blockwise", "block_size", "positive"],
    ),
}
OTHER_RUNS = {
    "good": [],  # W&B offline, as by default
    # 100000 steps cannot finish in 0.5 s on any machine; a later key overrides TINY's in a
    # single run, so the budget, not the machine's speed, decides the outcome.
    "over_time_budget": ["budget.max_seconds=0.5", "train.steps=100000", "logger=none"],
    "unknown_config_group_option": ["attention=nope", "logger=none"],
    # The variable is recorded whatever the job measures: nothing but the matmul rate.
    "huge_pages_off": ["logger=none", "train.steps=0", *MEASURE_NOTHING],
}
# Environment variables of a run beyond the CLI's (which unsets THP_MEM_ALLOC_ENABLE).
RUN_ENV = {"huge_pages_off": {"THP_MEM_ALLOC_ENABLE": "0"}}
PARALLEL = 5  # runs at once: each is mostly ~3 s of imports
Finished = tuple[subprocess.CompletedProcess, Path]  # a run and its run dir


@pytest.fixture(scope="module")
def single_runs(module_cli, tmp_path_factory) -> dict[str, Finished]:
    """{name: (finished process, its run dir)} of every run above, a few launched at a time."""
    root = tmp_path_factory.mktemp("single")
    launches = {name: [*overrides, "logger=none"] for name, (overrides, _) in BAD_RUNS.items()}
    launches.update(OTHER_RUNS)
    results, names = {}, list(launches)
    for first in range(0, len(names), PARALLEL):
        batch = names[first : first + PARALLEL]
        processes = {
            n: module_cli.start_single(root / n, *launches[n], env=RUN_ENV.get(n)) for n in batch
        }
        for name, process in processes.items():
            stdout, stderr = process.communicate(timeout=300)
            done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
            results[name] = (done, root / name)
    return results


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The run's whole stderr, which must be a single `error: ...` line."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", BAD_RUNS)
def test_bad_single_run_exits_non_zero_with_a_one_line_message(single_runs, name):
    done, run_dir = single_runs[name]
    assert done.returncode != 0
    message = one_line_error(done)
    assert not [word for word in BAD_RUNS[name][1] if word not in message], message
    # An invalid option is an error; options the variant cannot combine are skipped.
    status = "skipped" if name == "causal_linformer" else "error"
    assert json.loads((run_dir / "result.json").read_text())["status"] == status


@pytest.mark.slow
def test_single_run_over_its_time_budget_is_a_timeout(single_runs):
    done, run_dir = single_runs["over_time_budget"]
    assert done.returncode != 0
    assert "JobTimeout" in one_line_error(done) and "max_seconds=0.5" in done.stderr
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "timeout" and rec["job_seconds"] < 30


@pytest.mark.slow
def test_good_single_run_exits_zero_and_says_where_its_results_are(single_runs):
    done, run_dir = single_runs["good"]
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok"
    assert f"record: {run_dir / 'result.json'}" in done.stdout
    assert f"W&B run: {rec['offline_run_dir']}" in done.stdout
    assert wandb_runs.read(Path(rec["offline_run_dir"]))["summary"]["status"] == "ok"
    assert rec["thp_mem_alloc"] is True  # started without the variable: the job sets it


@pytest.mark.slow
def test_a_users_thp_mem_alloc_enable_0_is_respected_and_recorded(single_runs):
    done, run_dir = single_runs["huge_pages_off"]
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads((run_dir / "result.json").read_text())
    assert rec["status"] == "ok" and rec["thp_mem_alloc"] is False


@pytest.mark.slow
def test_unknown_config_group_option_fails_in_hydra_listing_the_options(single_runs):
    """`attention=nope` fails while Hydra composes the config, before the runner runs: Hydra's
    own multi-line message, which names the group and lists its options."""
    done, run_dir = single_runs["unknown_config_group_option"]
    assert done.returncode != 0
    assert "Could not find 'attention/nope'" in done.stderr
    assert "Available options in 'attention'" in done.stderr and "linformer" in done.stderr
    assert not (run_dir / "result.json").exists()
