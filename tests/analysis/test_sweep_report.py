"""The end of a sweep's report: into <sweep dir>/report/, then the W&B sweep summary run, both
only when the sweep's records changed."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from analysis import report, sweep_report
from experiments.app import sweep, tracking
from experiments.records import history, record, store
from tests import wandb_runs
from tests.conftest import WANDB_LOGGER


def update(sweep_dir, logger):
    """The report part of the end of a multirun of sweep `fixture` over `sweep_dir` (the app's
    step, experiments/app/sweep.py, which also logs the W&B summary run)."""
    config = {"hydra": {"sweep": {"dir": str(sweep_dir)}}, "sweep": "fixture", "logger": logger}
    multirun = sweep.Multirun(
        OmegaConf.create(config), earlier=set(), fail_on=("error",), report_step=sweep_report.update
    )
    multirun.report()


def test_report_and_wandb_summary_of_a_sweep(small_sweep, wandb_home, capsys, monkeypatch):
    monkeypatch.setattr(report, "FORMATS", ("png",))  # SVGs: see test_report.py
    store.write_results(small_sweep)  # results.parquet, as the end of a sweep writes it first
    update(small_sweep, WANDB_LOGGER)

    out = small_sweep / "report"
    text = (out / "report.md").read_text()
    assert text.startswith("# attnbench report")
    drawn = [name for name in report.FIGURES if f"![{name}]({name}.png)" in text]
    assert "time_vs_seq_len" in drawn and "depth" not in drawn  # depth is not swept here
    assert "tradeoff" not in drawn  # random tokens and Gaussian-era errors: no quality axis
    assert all((out / f"{name}.png").stat().st_size > 0 for name in drawn)
    (summary_dir,) = wandb_runs.find(small_sweep / "wandb")
    run = wandb_runs.read(summary_dir)
    assert (run["job_type"], run["group"], run["exit_code"]) == ("sweep-summary", "fixture", 0)
    logged = {key.split(".")[0] for row in run["history"] for key in row}  # nested: dotted
    assert {f"figures/{name}" for name in drawn} | {"records"} <= logged
    assert tracking.run_id("fixture", "results", small_sweep) in run["artifacts"]
    assert f"W&B sweep summary run: {summary_dir}" in capsys.readouterr().out


def test_without_wandb_only_the_report(sweep_copy, monkeypatch):
    built = []
    monkeypatch.setattr(report, "build_report", lambda frame, out, **_: built.append(out) or {})
    update(sweep_copy, {"name": "none"})
    assert built == [sweep_copy / "report"]
    assert not (sweep_copy / "wandb").exists()


def test_a_failing_report_does_not_fail_the_sweep(sweep_copy, monkeypatch, caplog):
    def broken(frame, out, **_):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(report, "build_report", broken)
    update(sweep_copy, {"name": "none"})
    assert "redraw it with: python -m analysis.report" in caplog.text


def test_empty_sweep_dir_is_not_an_error(tmp_path):
    update(tmp_path, {"name": "none"})
    assert not (tmp_path / "report").exists()


def test_a_report_is_redrawn_only_when_its_records_changed(sweep_copy, monkeypatch, capsys):
    drawn = []

    def draw(frame, out, **_):
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text("# attnbench report\n")
        drawn.append(len(frame))
        return {}

    monkeypatch.setattr(report, "build_report", draw)

    def end(logger=None):
        update(sweep_copy, logger or {"name": "none"})
        return len(drawn)

    assert end() == 1
    assert end() == 1 and "records unchanged" in capsys.readouterr().out  # a no-op resume
    path = sorted(sweep_copy.glob("*/result.json"))[0]
    rec = json.loads(path.read_text())
    record.write_json_atomic(path, {**rec, "step_ms": 1.0})  # a re-measured configuration
    assert end() == 2
    steps = history.History()
    steps.log_step({"loss": 1.0}, step=0)
    steps.write(history.beside(path))  # a history added
    assert end() == 3
    new = sweep_copy / "new" / "result.json"
    record.write_json_atomic(new, {**rec, "config_hash": "new", "job": "new"})
    assert end() == 4
    (sweep_copy / "report" / "report.md").unlink()  # a report deleted is drawn again
    assert end() == 5
    assert end({"name": "none", "extra": 1}) == 6  # other logger settings: another summary
    assert end() == 7 and end() == 7
