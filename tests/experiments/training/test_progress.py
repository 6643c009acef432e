"""The bar over a job's training steps, in a terminal only by default."""

from __future__ import annotations

import pytest

from experiments.job_config import JobConfig
from experiments.measurement import measure
from experiments.training import progress


def test_on_by_default_only_in_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert progress.enabled(None) and not progress.enabled(False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert not progress.enabled(None) and progress.enabled(True)


@pytest.mark.parametrize("setting", ["true", "false"])
def test_training_shows_a_bar_only_when_on(resolved_config, capfd, setting):
    config = resolved_config(
        "seq_len=32",
        "model.d_model=16",
        "model.n_heads=2",
        "train.steps=3",
        "train.eval_every=0",
        "train.eval_batches=1",
        f"train.progress={setting}",
        "measure.kernel=false",
        "measure.step=false",
        "measure.memory=false",
        "measure.approx_error=false",
        "measure.matmul_size=64",
        "logger=none",
    )
    job = JobConfig.of(config)
    measure.measure(job, measure.setup(job))
    err = capfd.readouterr().err
    assert ("3/3" in err and "loss=" in err) == (setting == "true"), err
