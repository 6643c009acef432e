"""The report command, run as a user runs it, on the committed fixture sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import load, report, section
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
    text = (out / "report.md").read_text()
    drawn = [name for name in report.FIGURES if f"![{name}]({name}.png)" in text]
    assert set(drawn) <= set(report.drawn_figures(load.load_results([FIXTURE])))
    assert "accuracy_vs_seq_len" not in drawn and "tradeoff" not in drawn  # no trained quality
    assert "time_vs_seq_len" in drawn and "depth" in drawn
    for name in drawn:
        for fmt in report.FORMATS:
            path = out / f"{name}.{fmt}"
            assert path.stat().st_size > 1000, path
    for heading in (
        "## Per variant",
        "## Memory and time vs depth",
        "## Not measured (oom, timeout, skipped, error, diverged)",
        "## Figures",
    ):
        assert heading in text
    # Every key that varies is a column: the variants' options, block, depth, training, ...
    assert "| variant | impl | n_hashes | k | block | causal | depth |" in text
    assert "| α fwd | α fwd+bwd |" in text and "| fwd+bwd (ms) @ L=512 |" in text
    assert "| full | math |  |  | residual | True | 1 | 2 | 5 | oom | 8,192 | 1 |" in text
    assert "timeout at 4,096" in text
    assert "| variant | block | depth 1 | depth 2 | depth 4 |" in text
    assert "![tradeoff]" not in text
    assert "- sweeps: " in text and "45 records (37 ok, 4 skipped, 3 timeout, 1 oom)" in text


def test_unreadable_records_are_listed_in_the_report_and_on_stderr(
    small_sweep, capsys, monkeypatch
):
    monkeypatch.setattr(report, "FIGURES", {})  # the tables are what is checked here
    broken = small_sweep / "99" / "result.json"
    broken.parent.mkdir()
    broken.write_text('{"status": "ok", "config_ha')
    out = small_sweep / "report"
    assert report.main([str(small_sweep), "--out", str(out)]) == 0
    assert f"warning: unreadable record {broken}: " in capsys.readouterr().err
    text = (out / "report.md").read_text()
    assert "## Unreadable records" in text and f"- `{broken}`: " in text


def test_a_figure_with_nothing_to_draw_is_left_out_and_named(small_sweep, monkeypatch):
    monkeypatch.setattr(report, "FORMATS", ("png",))
    two = {name: report.FIGURES[name] for name in ("time_vs_seq_len", "depth")}
    monkeypatch.setattr(report, "FIGURES", two)
    out = small_sweep / "report"
    (out / "depth.png").parent.mkdir()
    (out / "depth.png").write_bytes(b"an old figure")
    report.main([str(small_sweep), "--out", str(out)])
    text = (out / "report.md").read_text()
    assert "![time_vs_seq_len](time_vs_seq_len.png)" in text
    assert "![depth]" not in text and not (out / "depth.png").exists()
    assert "- depth: depth was not swept in these results" in text.split("### Not drawn")[1]


def test_cli_mistakes_get_one_line_and_exit_1(tmp_path, capsys, monkeypatch, wandb_home):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no W&B login
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, words in (
        ([str(tmp_path / "missing")], "no such file or directory"),
        ([str(empty)], "no result.json, results.csv"),
        (["--wandb", "someone/project"], "wandb login"),
    ):
        assert report.main([*args, "--out", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_cli_needs_results_or_wandb(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "give RESULTS or --wandb ENTITY/PROJECT" in capsys.readouterr().err


def test_a_record_of_the_wrong_type_is_named_and_left_out(small_sweep, capsys, monkeypatch):
    monkeypatch.setattr(report, "FIGURES", {})
    record = next(small_sweep.glob("*/result.json"))
    record.write_text(record.read_text().replace('"timestamp": "', '"timestamp": 17, "x": "'))
    assert report.main([str(small_sweep), "--out", str(small_sweep / "report")]) == 0
    assert f"warning: unreadable record {record}: " in capsys.readouterr().err


def test_an_ok_record_shown_over_a_newer_failure_is_said(small_sweep, capsys, monkeypatch):
    monkeypatch.setattr(report, "FIGURES", {})
    ok = next(small_sweep.glob("*/result.json"))
    rec = json.loads(ok.read_text())
    assert rec["status"] == "ok"
    failed = small_sweep / "again" / "result.json"
    failed.parent.mkdir()
    failed.write_text(json.dumps({**rec, "status": "oom", "timestamp": "2099-01-01T00:00:00"}))
    assert report.main([str(small_sweep), "--out", str(small_sweep / "report")]) == 0
    said = f"shows its ok record {ok}, not the newer oom record {failed}"
    assert said in capsys.readouterr().err
    assert said in (small_sweep / "report" / "report.md").read_text()


def test_an_out_dir_that_cannot_be_written_is_one_line(small_sweep, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "FIGURES", {})
    blocker = tmp_path / "a-file"
    blocker.write_text("not a dir")
    assert report.main([str(small_sweep), "--out", str(blocker / "report")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"error: --out {blocker / 'report'}: ") and len(err) == 1, err

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "report.md"))

    monkeypatch.setattr(report.Path, "write_text", read_only)
    assert report.main([str(small_sweep), "--out", str(tmp_path / "ro")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: --out {tmp_path / 'ro'}: Permission denied: {tmp_path}/ro/report.md"]


def test_the_sections_give_the_reports_order_of_tables_and_figures():
    """report.md's order, which the sections (analysis/section.py) compose: the tables section
    by section in TABLE_ORDER, then the figures in SECTIONS' order."""
    assert list(report.FIGURES) == [
        "time_vs_seq_len",
        "memory_vs_seq_len",
        "depth",
        "error_vs_seq_len",
        "error_vs_knob",
        "error_vs_time",
        "training_curves",
        "accuracy_vs_seq_len",
        "accuracy_vs_pairs",
        "recall_vs_state",
        "tradeoff",
        "flops_fraction",
        "decode_vs_context",
    ]
    assert [build.__name__ for build in report.TABLES] == [
        "variant_summary",
        "speedups",
        "crossovers_by_head_dim",
        "grouped_kv_heads",
        "depth_table",
        "failures",
        "timing_warnings",
        "explicit_path",
        "cross_evaluation",
        "quality",
        "quality_by_length",
        "capacity",
        "accuracy_by_pairs",
        "frontier_table",
        "mad_table",
        "listops_table",
        "published",
        "error_by_knob",
        "decode_table",
        "hybrid_table",
    ]


def test_every_section_has_one_place_in_each_order_and_its_own_figure_names():
    assert sorted(map(id, report.TABLE_ORDER)) == sorted(map(id, report.SECTIONS))
    names = [name for s in report.SECTIONS for name in s.figures]
    assert len(names) == len(set(names)) == len(report.FIGURES)  # no name drawn over another


def test_quality_and_decode_records_feed_their_tables_and_figures():
    """With `quality=` / `decode=`, these read those records; everything else the main frame."""
    reads = {name: spec.reads for name, spec in report.FIGURES.items()}
    reads |= {build.__name__: how for build, how in report.READS.items()}
    assert {name for name, how in reads.items() if how == section.QUALITY} == {
        "training_curves",
        "accuracy_vs_seq_len",
        "tradeoff",
        "quality",
        "quality_by_length",
        "mad_table",
        "listops_table",
        "published",
    }
    assert {name for name, how in reads.items() if how == section.DECODE} == {
        "decode_vs_context",
        "decode_table",
    }
    assert set(reads.values()) == {section.COST, section.QUALITY, section.DECODE}
