"""benchmarks/hf_generate.py: ms per token of HF generate on each cache, a row per variant and
prompt length, also as CSV; bad flags are one line."""

from __future__ import annotations

import csv
import math

import pytest

pytest.importorskip("transformers")

from benchmarks import hf_generate  # noqa: E402  (after the skip: it needs transformers)


def test_a_row_per_variant_and_length_in_the_table_and_the_csv(tmp_path, capsys):
    out = tmp_path / "gen.csv"
    args = ["--variants", "full,linear", "--lengths", "8,12", "--new", "2", "--rounds", "1"]
    assert hf_generate.main([*args, "--csv", str(out)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4  # header + 2 variants x 2 lengths
    rows = list(csv.DictReader(out.open()))
    assert [(r["variant"], r["prompt"]) for r in rows] == [
        ("full", "8"),
        ("full", "12"),
        ("linear", "8"),
        ("linear", "12"),
    ]
    # A per-token time is a difference of two timed generates (new tokens less one): on a
    # loaded machine with one round it can come out at or below 0, so only its form is tested.
    assert all(math.isfinite(float(r["default_ms"])) for r in rows)
    assert all(math.isfinite(float(r["kernel_ms"])) for r in rows)


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--new", "1"], "'--new' >= 2"), (["--variants", "nsa"], "nsa")],
)
def test_bad_flags_are_one_line(args, says, capsys):
    assert hf_generate.main(["--lengths", "8", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1
