"""Results at a glance: one row per variant, cells from the report's own functions, written
between README's markers. On the committed fixture sweep and the hand-made records of the
headline, accuracy and decode tests (whose values are worked out there)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import glance, kernel_time, load
from tests.analysis.conftest import FIXTURE
from tests.analysis.test_accuracy import _capacity, _long_range
from tests.analysis.test_decode_report import decode_records
from tests.analysis.test_headline import _cost


def _rows(block: str) -> dict[str, dict[str, str]]:
    """The table of a glance block as variant -> column title -> cell."""
    lines = [line for line in block.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _column(rows: dict[str, dict[str, str]], start: str) -> str:
    (title,) = [t for t in next(iter(rows.values())) if t.startswith(start)]
    return title


def test_each_variant_gets_its_crossover_memory_recall_capacity_and_decode_cost():
    block = glance.glance(
        _cost(),
        quality=_long_range(),
        decode_records=pd.DataFrame(decode_records()),
        capacity_records=_capacity(),
    )
    rows = _rows(block)
    # Order: exact attention, the cost sweep's variants, then those only the others measured.
    assert list(rows) == ["full", "blockwise", "lsh", "linear", "performer"]
    speed = _column(rows, "L* vs SDPA")
    assert rows["full"][speed] == "reference"
    assert rows["blockwise"][speed] == "1,000"  # 0.1·L = 1e-4·L²
    # O(L²) ran out of memory at 4096, so the factor is at 1024: 16·1024² B / 2048·1024 B = 8.
    memory = _column(rows, "kernel memory vs O(L²)")
    assert memory == "kernel memory vs O(L²) @ L=1,024"
    assert rows["blockwise"][memory] == "8.0× less"
    assert rows["full"][memory] == "16.0× less"  # SDPA's 1 KiB·L against 16 B·L²
    recall = _column(rows, "recall")
    assert recall == "recall @ L=1,024, 550 steps (floor 6.1%, chance 6.2%)"
    assert rows["full"][recall] == "97.0%" and rows["blockwise"][recall] == "20.0%"
    # Never learned: said so, with no number of its own.
    assert rows["lsh"][recall] == "not learned in 550 steps (control 6.2%)"
    held = _column(rows, "capacity")
    assert rows["linear"][held] == "head dim 16: 8; head dim 32: 16"
    assert rows["performer"][held].startswith("head dim 16: not learned in 600 steps")
    assert rows["full"][held] == "reference" and rows["blockwise"][held] == "—"
    decoding = _column(rows, "decode")
    assert decoding == "decode @ 64K, batch 1: ms/token · cache"
    assert rows["full"][decoding] == "65.5 ms · 128 MiB"  # 1e-3·65536 ms, 2·4·65536·64·4 B
    assert rows["linear"][decoding] == "0.2 ms · 65 KiB"
    assert rows["blockwise"][decoding] == "0.5 ms · 512 KiB (at 4K)"  # timed out at 64K
    assert rows["lsh"][decoding] == "—" and rows["performer"][speed] == "—"
    assert "WARNING" not in block  # exact attention reached 97 % at 1024


def test_exact_attention_below_the_ceiling_is_a_warning():
    quality = _long_range()
    quality.loc[quality["attention"] == "full", "eval_accuracy"] = 0.5
    assert "WARNING: exact attention reached 50.0% at L=1,024" in glance.glance(
        _cost(), quality=quality
    )


def _write_sweep(path, records):
    for i, rec in enumerate(records):
        (path / str(i)).mkdir(parents=True)
        rec = {"offline_run_dir": None, "error": None, **rec}  # as experiments.run writes them
        (path / str(i) / "result.json").write_text(json.dumps(rec))


def test_the_command_writes_between_the_markers_from_the_fixture_sweep(small_sweep, tmp_path):
    _write_sweep(tmp_path / "decode", decode_records())
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n{glance.BEGIN}\nold table\n{glance.END}\n## after\n")
    args = [str(small_sweep), "--decode", str(tmp_path / "decode"), "--write", str(readme)]
    assert glance.main(args) == 0
    text = readme.read_text()
    assert text.startswith(
        f"# top\n{glance.BEGIN}\nMeasured by sweeps `scaling`, `timeout`, `decode`;"
    )
    assert "old table" not in text and text.endswith(f"\n{glance.END}\n## after\n")
    block = text[text.index(glance.BEGIN) + len(glance.BEGIN) : text.index(glance.END)]
    records = [json.loads(p.read_text()) for p in small_sweep.glob("*/result.json")]
    (commit,) = {r["git_commit"][:7] for r in records}
    newest = max(r["timestamp"] for r in records)[:10]  # newer than the decode records' 2026-01-01
    assert f"newest record {newest};" in block and f"git commit {commit}." in block
    assert f"machine: {records[0]['hostname']}, {records[0]['device_name']} (cpu)" in block
    rows = _rows(block)
    assert list(rows)[:2] == ["full", "lsh"] and set(rows) == {"full", "lsh", "linear", "blockwise"}
    # lsh's L* is the report's "Per variant" one (these records: against exact's own jobs).
    summary = kernel_time.variant_summary(load.tidy(load.load_results([small_sweep])))
    expected = summary.frame.set_index("variant")["L* fwd+bwd"]
    speed = _column(rows, "L* vs SDPA")
    assert rows["lsh"][speed] == expected["lsh"] != "—"
    assert rows["full"][speed] == "reference"
    # No kernel memory, quality or capacity in these records: every such cell says so.
    for column in ("kernel memory", "recall", "capacity"):
        assert {row[_column(rows, column)] for row in rows.values()} == {"—"}
    assert rows["linear"][_column(rows, "decode")] == "0.2 ms · 65 KiB"
    # Twice gives the same file: the markers stay and nothing accumulates.
    assert glance.main(args) == 0 and readme.read_text() == text


def test_without_markers_or_results_the_command_fails_in_one_line(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert glance.main([str(FIXTURE), "--write", str(readme)]) == 1
    assert capsys.readouterr().err.startswith("error: --write: ")
    assert glance.main([str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("option", ["--quality", "--decode", "--capacity"])
def test_a_missing_other_sweep_names_its_option(tmp_path, capsys, option):
    assert glance.main([str(FIXTURE), option, str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {option}: ")


def test_a_busy_run_adds_its_crossovers_and_their_ratio_to_the_quiet_ones():
    quiet = _cost()
    busy = quiet.copy()
    slower = busy["attention"] == "blockwise"
    busy.loc[slower, "attn_fwd_bwd_ms"] *= 1.25  # 0.125·L = 1e-4·L² at L = 1250
    rows = _rows(glance.glance(quiet, busy=busy))
    column = _column(rows, "L* beside a busy core")
    assert rows["blockwise"][column] == "1,250 (1.25×)"
    assert rows["full"][column] == glance.EMPTY  # the reference has no crossover of its own
    assert "L* beside a busy core" not in "".join(_rows(glance.glance(quiet))["full"])


def test_the_capacity_cell_holds_the_head_dims_not_the_chosen_rates():
    """Of a rate grid the report's capacity table adds the chosen rate per head dim; the
    glance's cell keeps to the capacities (the rates are the report's)."""
    records = _capacity()
    grid = pd.concat(
        [
            records.assign(**{"train.lr": 1e-3, "valid_accuracy": 0.9}),
            records.assign(**{"train.lr": 1e-2, "valid_accuracy": 0.5}),
        ]
    )
    cells = glance._capacity(grid)
    assert cells["linear"].startswith("head dim 16: ") and "lr" not in cells["linear"]


def test_the_capacity_column_reads_the_sweeps_usual_depth_only():
    """Depth-4 models beside a depth-2 capacity sweep are the capacity page's rows, not the
    glance's: one row per variant, at the preset's depth."""
    from tests.analysis.suite_records import CAPACITY_PAIRS, capacity_sweep

    shape = {"d_model": 64, "n_heads": 4, "train.steps": 400, "trained_steps": 400}
    full = (1.0,) * len(CAPACITY_PAIRS)
    frame = capacity_sweep(
        [
            ("full", full, {**shape, "depth": 2}),
            ("linear", (0.99, 0.97, 0.92, 0.6, 0.3), {**shape, "depth": 2}),
            ("linear", full, {**shape, "depth": 4}),
            ("full", full, {**shape, "depth": 4}),
            ("full", full, {**shape, "depth": 2, "seed": 1}),
        ]
    )
    assert glance._capacity(frame) == {"full": "reference", "linear": "head dim 16: 16"}
