"""The report command, run as a user runs it, on the committed fixture sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analysis import load, report
from tests.analysis.conftest import FIXTURE

ROOT = Path(__file__).resolve().parents[2]


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analysis.report", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_writes_every_figure_and_the_tables(tmp_path):
    out = tmp_path / "report"
    result = run_report(str(FIXTURE), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"report: {out / 'report.md'}" in result.stdout
    drawn = report.drawn_figures(load.load_results([FIXTURE]))
    assert "accuracy_vs_seq_len" not in drawn and "tradeoff" not in drawn  # no trained quality
    for name in drawn:
        for fmt in report.FORMATS:
            path = out / f"{name}.{fmt}"
            assert path.stat().st_size > 1000, path
    text = (out / "report.md").read_text()
    for heading in (
        "## Per variant",
        "## Memory and time vs depth",
        "## Not measured (oom, timeout, skipped, error, diverged)",
        "## Figures",
    ):
        assert heading in text
    assert "| variant | α fwd | α fwd+bwd |" in text
    assert "| full impl=math | oom | 8,192 |" in text
    assert "timeout at 4,096" in text
    for name in drawn:
        assert f"![{name}]({name}.png)" in text
    assert "![tradeoff]" not in text
    assert "- sweeps: " in text and "45 records (37 ok, 4 skipped, 3 timeout, 1 oom)" in text


def test_cli_needs_results_or_wandb(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "give RESULTS or --wandb ENTITY/PROJECT" in capsys.readouterr().err
