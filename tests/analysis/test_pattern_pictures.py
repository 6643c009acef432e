"""`python -m analysis.pattern_pictures`: the pattern pictures, drawn from the kernels'
predicates."""

from __future__ import annotations

import torch

from analysis import pattern_pictures as pictures
from tests.reference import causal_rule, local_rule, rule_mask


def test_writes_every_figure_as_png_and_svg(tmp_path, capsys):
    assert pictures.main(["--out", str(tmp_path / "out")]) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {"patterns.png", "patterns.svg", "vocabulary.png", "vocabulary.svg"}
    assert all((tmp_path / "out" / n).stat().st_size > 1000 for n in names)
    assert "patterns.png" in capsys.readouterr().out


def test_every_fixed_and_combined_variant_is_drawn_causal_and_not():
    drawn = pictures.variant_patterns()
    assert set(drawn) == {
        "blockwise",
        "strided",
        "combined",
        "longformer",
        "bigbird",
        "sparse_fixed",
        "sliding_window",
    }
    assert all(set(by_causal) == {False, True} for _, by_causal in drawn.values())
    # A block of 8 tokens: blockwise's picture is the hand-written local mask at that size.
    causal = drawn["blockwise"][1][True].dense(64)
    expected = rule_mask(64, local_rule(8, 1, 0)) & rule_mask(64, causal_rule)
    assert torch.equal(causal, expected)


def test_presets_are_scaled_to_blocks_of_eight():
    assert pictures.scaled_options({"block_size": 128, "n_global": 1, "n_summary": 32}) == {
        "block_size": 8,
        "n_global": 1,
        "n_summary": 2,
    }
