"""One job in-process (`run_job`): resume reading records, and failures recorded as data.

The same jobs through the CLI, in real Hydra sweeps, are in tests/experiments/test_run.py.
"""

from __future__ import annotations

import json
import logging
import math

import pytest

from experiments.app.job import import_for_measuring, run_job
from tests.experiments.conftest import TINY
from tests.experiments.test_run import QUICK


@pytest.mark.parametrize("text", ['{"status": "ok", "config_ha', "[]"])  # cut short; no object
def test_an_unreadable_record_is_measured_again_and_says_so(
    resolved_config, tmp_path, caplog, text
):
    sweep_dir = tmp_path / "sweep"
    path = sweep_dir / "0" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    (sweep_dir / "1").mkdir()
    (sweep_dir / "1" / "result.json").write_text(text)  # another job's: resume reads it too
    config = resolved_config(*TINY, *QUICK)
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        rec = run_job(config, path.parent, job="0", sweep_dir=sweep_dir)
    assert f"{path} is unreadable" in caplog.text
    assert "measuring this configuration again" in caplog.text
    assert rec["status"] == "ok" and json.loads(path.read_text()) == rec


def test_a_run_whose_eval_loss_is_not_finite_is_diverged(resolved_config, tmp_path):
    """Scenario 4: `train.steps=1 train.lr=1e30` was recorded ok with eval_loss null."""
    config = resolved_config(*TINY, *QUICK, "train.steps=1", "train.lr=1e30")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "diverged", rec["error"]
    assert rec["error"].startswith("Diverged: eval_loss is nan after 1 training steps")


def test_any_non_finite_measured_float_is_diverged_naming_it(
    resolved_config, tmp_path, monkeypatch
):
    measure = import_for_measuring()  # the module the job measures with
    real = measure.measure
    monkeypatch.setattr(
        measure, "measure", lambda *a, **k: {**real(*a, **k), "approx_rel_error": math.inf}
    )
    config = resolved_config(*TINY, *QUICK, "train.steps=1")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert (rec["status"], rec["error"]) == (
        "diverged",
        "Diverged: non-finite approx_rel_error=inf",
    )
    assert rec["train_loss"] > 0  # the finite figures are kept
    assert json.loads((tmp_path / "0" / "result.json").read_text())["approx_rel_error"] is None


def test_a_top_level_key_added_on_the_command_line_is_an_error_naming_the_nearest(
    resolved_config, tmp_path
):
    """Scenario 7: `+seqlen=128` was hashed, recorded and measured at the default length."""
    config = resolved_config(*TINY, *QUICK, "+seqlen=128")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None, added=["seqlen"])
    assert rec["status"] == "error"
    assert (
        "option 'seqlen' (added with +seqlen=) is unknown; did you mean 'seq_len'?"
        in (rec["error"])
    )
