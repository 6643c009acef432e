"""The masks-and-GQA cost benchmark at a toy length: its table's shape and its ratios."""

from __future__ import annotations

import math

import pytest

from benchmarks import mask_cost
from experiments.measurement.timing import Ratio


def test_toy_run_writes_a_row_per_variant_with_positive_finite_ratios(tmp_path, capsys):
    snapshot = tmp_path / "masks.csv"
    rows = mask_cost.main(
        ["--seq-len", "256", "--kernels", "full,lsh", "--rounds", "1"]
        + ["--min-round-s", "0", "--csv", str(snapshot)]
    )
    measured = capsys.readouterr().out
    assert [row.variant for row in rows] == ["full", "lsh"]
    assert set(rows[0].costs) == {"padding", "documents", "gqa"}
    assert set(rows[1].costs) == {"padding", "documents"}  # lsh (shared QK): no grouped heads
    assert mask_cost.finite_positive(rows)
    # full takes grouped heads natively: fewer key heads, smaller gradients of k and v
    assert 0 < rows[0].costs["gqa"].memory_ratio < 1
    # the snapshot's table is the measured one, read back without measuring
    assert mask_cost.read_csv(snapshot)[0] == rows
    mask_cost.main(["--table", str(snapshot)])
    text = capsys.readouterr().out
    assert text.strip() in measured
    assert "L=256" in text and "1 thread(s)" in text and "commit" in text
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + 2  # header, rule, one line per variant
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    assert all(len(row) == 7 for row in cells)
    full, lsh = cells
    assert full[0] == "`full`" and lsh[0] == "`lsh`"
    for value in (*full[1:], *lsh[1:4]):
        number = float(value.strip("*").split("×")[0].strip("*"))
        assert number > 0 and math.isfinite(number)
    assert lsh[4:7] == ["—", "—", "—"]


def test_only_a_mask_past_the_bound_on_a_block_skipping_kernel_is_flagged():
    def row(variant, feature, value):
        return mask_cost.Row(variant, {feature: mask_cost.Cost(Ratio(value, 0.0, 3), 1.0)})

    assert row("blockwise", "padding", 1.5).flagged("padding")
    assert not row("blockwise", "padding", 1.2).flagged("padding")
    assert not row("linear", "documents", 2.0).flagged("documents")  # no blocks to skip
    assert row("bigbird", "documents", 1.5).flagged("documents")  # a preset of combined
    assert not row("lsh", "padding", 2.0).flagged("padding")  # sorted windows, no fixed blocks
    assert not row("full", "gqa", 2.0).flagged("gqa")  # the bound is the masks'
    assert "⚠" in mask_cost.cell(row("full", "documents", 1.5), "documents")


def test_a_snapshot_keeps_failures_and_unmeasured_memory(tmp_path):
    rows = [
        mask_cost.Row("full", {"padding": mask_cost.Cost(Ratio(0.5, 0.01, 5), 812.5)}),
        mask_cost.Row("nsa", {"gqa": mask_cost.Cost(error="RuntimeError: out of memory")}),
    ]
    settings = mask_cost.Settings(16384, 5, 1, "abc1234", "2026-12-07")
    mask_cost.write_csv(rows, settings, tmp_path / "s.csv")
    assert mask_cost.read_csv(tmp_path / "s.csv") == (rows, settings)
    assert "error: RuntimeError: out of memory" in mask_cost.table(rows)


def test_a_bad_snapshot_or_csv_folder_is_one_line_before_any_measuring(tmp_path):
    with pytest.raises(SystemExit, match=r"--table .*not a mask_cost snapshot"):
        mask_cost.main(["--table", str(tmp_path / "missing.csv")])
    with pytest.raises(SystemExit, match=r"--csv: folder .* does not exist"):
        mask_cost.main(["--kernels", "full", "--csv", str(tmp_path / "no" / "s.csv")])
