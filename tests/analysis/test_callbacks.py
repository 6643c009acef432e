"""The Hydra callback: report into <sweep dir>/report/, then the W&B sweep summary run."""

from __future__ import annotations

from omegaconf import OmegaConf

from analysis import offline_runs, report
from analysis.callbacks import SweepReport
from tests.conftest import WANDB_LOGGER


def multirun_config(sweep_dir, logger):
    """The parts of a multirun's config the callback reads."""
    return OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(sweep_dir)}}, "sweep": "fixture", "logger": logger}
    )


def test_report_and_wandb_summary_of_a_sweep(small_sweep, wandb_home, capsys, monkeypatch):
    monkeypatch.setattr(report, "FORMATS", ("png",))  # SVGs: see test_report.py
    SweepReport().on_multirun_end(multirun_config(small_sweep, WANDB_LOGGER))

    out = small_sweep / "report"
    text = (out / "report.md").read_text()
    assert text.startswith("# attnbench report")
    drawn = [name for name in report.FIGURES if f"![{name}]({name}.png)" in text]
    assert "time_vs_seq_len" in drawn and "depth" not in drawn  # depth is not swept here
    assert "tradeoff" not in drawn  # random tokens and Gaussian-era errors: no quality axis
    assert all((out / f"{name}.png").stat().st_size > 0 for name in drawn)
    (summary_dir,) = offline_runs.find_offline_runs(small_sweep / "wandb")
    run = offline_runs.read_offline_run(summary_dir)
    assert (run["job_type"], run["group"], run["exit_code"]) == ("sweep-summary", "fixture", 0)
    logged = {key for row in run["history"] for key in row}
    assert {f"figures/{name}" for name in drawn} | {"records"} <= logged
    assert f"W&B sweep summary run: {summary_dir}" in capsys.readouterr().out


def test_without_wandb_only_the_report(sweep_copy, monkeypatch):
    built = []
    monkeypatch.setattr(report, "build_report", lambda frame, out, **_: built.append(out) or {})
    SweepReport().on_multirun_end(multirun_config(sweep_copy, {"name": "none"}))
    assert built == [sweep_copy / "report"]
    assert not (sweep_copy / "wandb").exists()


def test_a_failing_report_does_not_fail_the_sweep(sweep_copy, monkeypatch, caplog):
    def broken(frame, out, **_):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(report, "build_report", broken)
    SweepReport().on_multirun_end(multirun_config(sweep_copy, {"name": "none"}))
    assert "redraw it with: python -m analysis.report" in caplog.text


def test_empty_sweep_dir_is_not_an_error(tmp_path):
    SweepReport().on_multirun_end(multirun_config(tmp_path, {"name": "none"}))
    assert not (tmp_path / "report").exists()
