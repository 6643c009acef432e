"""The drawing kit (analysis.figures): a variant keeps its colour and a block type its line
style in every figure, and every report figure saves, empty, from results with no measurement."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis import figures, kernel_time, load, peak_memory, report
from tests.analysis.conftest import synthetic_records
from tests.analysis.test_kernel_time import two_variants


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_every_figure_draws_for_results_without_any_measurement(frame, tmp_path):
    failed_only = frame[frame["status"] != "ok"]
    for name, spec in report.FIGURES.items():
        figure = spec.draw(failed_only)
        assert figures.nothing_drawn(figure), name  # so the report leaves it out
        figure.savefig(tmp_path / f"{name}.png")  # and it still saves: no log axis of nothing


def line_colors(figure: Figure) -> dict[str, tuple]:
    lines = [line for ax in figure.axes[:1] for line in ax.get_lines() if line.get_label()]
    return {line.get_label().split()[0]: line.get_color() for line in lines}


def test_a_variant_keeps_its_colour_in_every_report():
    one = line_colors(
        kernel_time.time_vs_seq_len(two_variants(("compressed", 900.0), ("lsh", 1e3)))
    )
    two = line_colors(kernel_time.time_vs_seq_len(two_variants(("lsh", 1e3), ("blockwise", 800.0))))
    assert one["lsh"] == two["lsh"] == figures.variant_color("lsh")
    assert len({one["full"], one["compressed"], one["lsh"], two["blockwise"]}) == 4
    # A name the registry does not know (yet) gets a colour of its own name, every time.
    unknown = "not_registered_yet"
    assert figures.variant_color(unknown) == figures.variant_color(unknown)


def test_block_types_have_their_own_line_styles():
    records = [
        {
            "status": "ok",
            "attention": "full",
            "block": block,
            "task": "random_lm",
            "seq_len": 256,
            "depth": depth,
            "peak_memory_bytes": depth * 2**20,
            "step_ms": 10.0 * depth,
        }
        for block in ("residual", "reversible", "checkpoint")
        for depth in (1, 2, 4)
    ]
    figure = peak_memory.depth(load.tidy(pd.DataFrame(records)))
    styles = {line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()}
    assert styles == {
        "full block=residual": "-",
        "full block=reversible": "--",
        "full block=checkpoint": ":",
    }
