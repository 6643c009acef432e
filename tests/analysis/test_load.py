"""Loading: result.json, CSV and Parquet give the same tidy frame; curves come from histories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import load, report
from experiments.records import history, record, store
from tests.analysis.conftest import FIXTURE, fixture_records

# Where a row came from, not its values.
BOOKKEEPING = {"source", "history_path", "offline_run_dir", "wandb_path"}


def assert_same_records(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert len(a) == len(b)
    columns = sorted((set(a.columns) & set(b.columns)) - BOOKKEEPING)
    a = a.sort_values("config_hash").reset_index(drop=True)[columns]
    b = b.sort_values("config_hash").reset_index(drop=True)[columns]
    pd.testing.assert_frame_equal(a, b, check_dtype=False, check_exact=False, rtol=1e-12)


def test_fixture_sweep_has_the_documented_schema():
    frame = load.load_results([FIXTURE])
    assert len(frame) == len(fixture_records())
    for column in (*load.IDENTITY, *load.CONFIG, *load.MEASUREMENTS, *load.ADDED):
        assert column in frame, column
    assert set(frame["status"]) <= set(record.STATUSES)
    assert all(frame[c].dtype == float for c in load.MEASUREMENTS)
    failed = frame[frame["status"] != "ok"]
    assert failed[["attn_fwd_ms", "step_ms", "peak_memory_bytes"]].isna().all().all()
    assert frame["seq_len"].dtype.kind == "i"
    # The variant names the options that differ between one attention's records.
    assert {
        "full impl=math",
        "full impl=sdpa",
        "lsh n_hashes=1",
        "linformer k=256",
        "blockwise",
    } <= set(frame["variant"])
    assert frame["source"].eq(str(FIXTURE)).all()


def test_results_csv_and_parquet_load_like_the_records(sweep_copy):
    store.write_results(sweep_copy)
    from_records = load.load_results([sweep_copy])
    for name in ("results.csv", "results.parquet"):
        assert_same_records(from_records, load.load_results([sweep_copy / name]))
    # A sweep dir with only the gathered files (e.g. copied without job dirs) loads too.
    gathered = sweep_copy.parent / "gathered"
    gathered.mkdir()
    shutil.copy(sweep_copy / "results.csv", gathered)
    assert_same_records(from_records, load.load_results([gathered]))


def test_missing_results_are_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no result.json"):
        load.load_results([tmp_path])


@pytest.fixture
def trained_sweep(tmp_path) -> Path:
    """Three fixture records re-recorded as a runner job does: result.json plus the job's
    history.parquet (experiments/records/history.py), per-step losses for the two that trained; the
    lsh configuration was recorded twice, and the older record's history must not be used."""
    picked = [
        {**r, "task": "text", "task.name": "text", "trained_steps": 100}  # curves worth drawing
        for r in fixture_records()
        if r["sweep"] == "scaling"
        and r["seq_len"] == 512
        and r["seed"] == 0
        and r["attention"] in ("full", "lsh", "linformer")
    ]
    sweep = tmp_path / "trained_sweep"
    for job, rec in enumerate(picked):
        steps = history.History()
        if rec["status"] == "ok":
            for step in range(3):
                metrics = {"loss": 6.0 - 0.5 * step - job, "train/lr": 1e-3, "note": "text"}
                if step == 2:
                    metrics.update({"eval/loss": 5.5 - job, "eval/accuracy": 0.25})
                steps.log_step(metrics, step)
        steps.write(sweep / str(job) / history.FILE)
        record.write_json_atomic(sweep / str(job) / "result.json", rec)
        if rec["attention"] == "lsh":  # an older attempt, elsewhere, with another curve
            older = {**rec, "timestamp": "2000-01-01T00:00:00", "job": "old"}
            steps.log_step({"loss": 99.0}, step=7)
            steps.write(sweep / "old" / history.FILE)
            record.write_json_atomic(sweep / "old" / "result.json", older)
    return sweep


def test_training_curves_come_from_each_records_history(trained_sweep, tmp_path):
    frame = load.load_results([trained_sweep])
    assert sorted(frame["status"]) == ["ok", "ok", "skipped"]
    trained = frame["status"] == "ok"
    assert frame.loc[trained, "history_path"].map(lambda p: Path(p).is_file()).all()
    assert frame.loc[~trained, "history_path"].isna().all()  # no steps, no file

    curves = load.load_curves(frame)
    lsh_row = frame.index[frame["attention"] == "lsh"][0]
    lsh = curves[(curves["row"] == lsh_row) & (curves["metric"] == "train/loss")]
    assert lsh["step"].tolist() == [0, 1, 2]  # the kept record's history, not the older one's
    assert set(curves["metric"]) == {"train/loss", "eval/loss", "eval/accuracy"}
    full_row = frame.index[frame["attention"] == "full"][0]
    full = curves[(curves["row"] == full_row) & (curves["metric"] == "eval/loss")]
    assert full["value"].tolist() == [5.5 - int(frame.loc[full_row, "job"])]

    # A moved sweep, or its results table beside the job dirs, finds the histories again.
    moved = Path(shutil.copytree(trained_sweep, tmp_path / "moved"))
    shutil.rmtree(trained_sweep)
    relocated = load.load_results([moved])
    assert relocated["history_path"].dropna().map(lambda p: p.startswith(str(moved))).all()
    assert load.load_curves(relocated).equals(curves)
    store.write_results(moved)
    from_table = load.load_results([moved / "results.parquet"])
    assert load.load_curves(from_table).equals(curves)


def test_a_damaged_history_is_named_and_only_its_curve_is_left_out(trained_sweep, caplog):
    frame = load.load_results([trained_sweep])
    full_row = frame.index[frame["attention"] == "full"][0]
    damaged = Path(frame.loc[full_row, "history_path"])
    damaged.write_bytes(b"not a parquet file")  # as a crash or a bad copy could leave it
    with caplog.at_level("WARNING", logger="attnbench"):
        curves = load.load_curves(frame)
    assert full_row not in set(curves["row"])
    assert set(curves["row"]) == set(frame.index[frame["attention"] == "lsh"])  # the rest drawn
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(damaged) in warned[0] and "\n" not in warned[0], warned

    # The report of the sweep is drawn, that job's curve left out, and exits 0.
    caplog.clear()
    out = trained_sweep / "report"
    with caplog.at_level("WARNING", logger="attnbench"):
        assert report.main([str(trained_sweep), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and (out / "training_curves.png").is_file()
    assert [str(damaged) in r.getMessage() for r in caplog.records] == [True]


class FakeRun:
    def __init__(self, run_id, job_type, summary):
        self.id, self.job_type, self.summary_metrics = run_id, job_type, summary
        self.path = ["me", "attnbench", run_id]
        self.url = f"https://wandb.example/me/attnbench/runs/{run_id}"


class FakeApi:
    """What `load_wandb` uses of `wandb.Api()`: runs(path, filters) with summaries."""

    def __init__(self, runs):
        self._runs, self.calls = runs, []

    def runs(self, path, filters):
        self.calls.append((path, filters))
        return self._runs


def test_wandb_api_runs_load_like_the_records():
    records = fixture_records()[:4]
    runs = [
        FakeRun(
            f"r{i}",
            "bench",
            {
                **{k: v for k, v in r.items() if v is not None},
                "train/loss": 1.0,
                "step": 3,
                "_runtime": 2.0,
            },
        )
        for i, r in enumerate(records)
    ]
    runs.append(FakeRun("summary", load.SUMMARY_JOB_TYPE, {"n_records": 4}))
    api = FakeApi(runs)
    frame = load.load_wandb("me/attnbench", "scaling", api=api)
    assert api.calls == [("me/attnbench", {"group": "scaling"})]
    assert sorted(frame["wandb_path"]) == [f"me/attnbench/r{i}" for i in range(4)]
    assert not {"train/loss", "step", "_runtime"} & set(frame.columns)
    assert_same_records(load.tidy(pd.DataFrame(records)), frame)


def test_an_error_recorded_before_trained_activations_is_read_as_the_gaussian_one():
    old = {"status": "ok", "attention": "lsh", "seq_len": 64, "approx_rel_error": 1.7}
    new = {**old, "approx_rel_error": 0.2, "approx_rel_error_gaussian": 1.6}
    new["approx_reference_digest"] = "abc123"
    frame = load.tidy(pd.DataFrame([old, new]))
    assert frame["approx_rel_error_gaussian"].tolist() == [1.7, 1.6]
    assert pd.isna(frame.loc[0, "approx_rel_error"]) and frame.loc[1, "approx_rel_error"] == 0.2


def test_records_before_the_heads_columns_get_them_from_d_model_and_n_heads():
    old = {"status": "ok", "attention": "full", "d_model": 256, "n_heads": 4}
    grouped = {**old, "n_heads": 8, "head_dim": 32, "n_kv_heads": 2, "model.n_kv_heads": 2}
    frame = load.tidy(pd.DataFrame([old, grouped]))
    assert frame["head_dim"].tolist() == [64, 32] and frame["n_kv_heads"].tolist() == [4, 2]


def test_records_before_an_option_existed_get_its_hash_neutral_default():
    """A Gated DeltaNet record from before `dt_min` joins the newer records of the same
    configuration (one label); a variant without the option keeps none."""
    base = {"status": "ok", "seq_len": 256}
    old = {**base, "attention": "gated_deltanet"}
    new = {**base, "attention": "gated_deltanet", "attention.dt_min": 0.001}
    other = {**base, "attention": "full"}
    frame = load.tidy(pd.DataFrame([old, new, other]))
    by_attention = frame.set_index("attention")["attention.dt_min"]
    assert by_attention["gated_deltanet"].tolist() == [0.001, 0.001]
    assert by_attention["full"] is None
    assert record.HASH_NEUTRAL_DEFAULTS["attention.dt_min"] == 0.001


def _stringified_like_the_old_store(frame: pd.DataFrame) -> pd.DataFrame:
    """results.parquet as the store wrote it before the record schema typed it: every object
    column as text, missing values None."""
    old = frame.copy()
    for column in old.columns:
        if old[column].dtype == object:
            old[column] = old[column].map(lambda v: None if pd.isna(v) else str(v))
    return old


def test_records_of_the_old_format_load_with_the_schemas_types(tmp_path):
    """The fixture records predate the schema: no resolved `shared_qk`, no
    `approx_reference_digest` (their `approx_rel_error` was measured on N(0, 1) inputs), no
    `precision` or `timing_warning`."""
    old = fixture_records()
    assert not {"shared_qk", "approx_reference_digest", "precision"} & set().union(*old)
    frame = load.load_results([FIXTURE])
    assert frame["seq_len"].dtype.kind == "i" and frame["threads"].dtype.kind in "if"
    assert set(frame["causal"]) <= {True, False} and frame["job"].map(type).eq(str).all()
    assert all(frame[c].dtype == float for c in load.MEASUREMENTS)
    assert frame["shared_qk"].isna().all()  # model.shared_qk was null: not known then
    errors = sorted(r["approx_rel_error"] for r in old if r.get("approx_rel_error") is not None)
    assert errors and sorted(frame["approx_rel_error_gaussian"].dropna()) == errors
    assert frame["approx_rel_error"].isna().all()

    gathered = store.gather(FIXTURE)
    _stringified_like_the_old_store(gathered).to_parquet(tmp_path / "results.parquet")
    from_old_parquet = load.load_results([tmp_path / "results.parquet"])
    assert_same_records(frame, from_old_parquet)
    assert from_old_parquet["causal"].map(type).eq(bool).all()
    assert from_old_parquet["model.depth"].dtype.kind == "i"  # a config key, read back


def test_every_column_the_frame_has_for_every_source_comes_from_the_schema():
    for name in (*load.IDENTITY, *load.CONFIG, *load.MEASUREMENTS, *load.PROVENANCE):
        assert record.column(name) is not None, name
    assert all(record.column(name).numeric for name in load.MEASUREMENTS)
