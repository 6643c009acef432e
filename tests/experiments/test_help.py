"""`attnbench --help`: the app's own short text, its lists read from the config groups."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.experiments.conftest import ROOT

GROUPS = ("attention", "block", "task", "experiment", "logger")


@pytest.fixture(scope="module")
def help_run() -> subprocess.CompletedProcess:
    """`--help` once, with `-X importtime`: every module it imported is a line of its stderr."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "experiments.run", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def help_text(help_run) -> str:
    return help_run.stdout


def test_help_starts_no_torch(help_run):
    """Help is read before any job: the app's import leaves torch (seconds of it) for the job."""
    imported = [line.rsplit("|", 1)[-1].strip() for line in help_run.stderr.splitlines()]
    assert "experiments.job_config" in imported  # the app and its settings were loaded
    assert [name for name in imported if name.split(".")[0] == "torch"] == []


def test_help_is_the_apps_own_and_short(help_text):
    lines = help_text.splitlines()
    assert len(lines) <= 50
    assert lines[0].startswith("attnbench") and "Hydra" not in lines[0]
    assert "powered by Hydra" not in help_text and "== Config ==" not in help_text
    for example in ("seq_len=4096", "+experiment=scaling", "logger=none", "train.steps="):
        assert example in help_text


@pytest.mark.parametrize("group", GROUPS)
def test_help_lists_every_option_of_each_group_as_conf_holds_it(help_text, group):
    options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    assert f"{group}: {', '.join(options)}" in help_text.splitlines()


def test_the_logger_schema_is_not_offered_as_a_logger(help_text):
    assert "wandb_schema" not in help_text and "schema" not in help_text
