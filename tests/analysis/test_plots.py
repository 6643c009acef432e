"""Figures and tables on synthetic results with known exponents, crossover and failures."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis import load, plots, report, scaling, series, tables
from tests.analysis.conftest import synthetic_records


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def texts(figure: Figure) -> list[str]:
    """Every text drawn in the figure: titles, annotations, legend entries."""
    found = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in found if t]


def test_scaling_fits_recover_exponents_and_crossover(frame):
    labelled, keys = series.with_series(frame, x="seq_len")
    fits = scaling.scaling_fits(labelled, keys, "attn_fwd_bwd_ms")
    assert fits["full"].power_law.exponent == pytest.approx(2.0, abs=1e-9)
    assert fits["lsh"].power_law.exponent == pytest.approx(1.0, abs=1e-9)
    assert fits["full"].crossover is None  # the reference itself
    assert fits["lsh"].crossover.kind == "crossed"
    assert fits["lsh"].crossover.length == pytest.approx(1000.0, rel=1e-6)


def test_time_figure_has_exponents_crossover_and_failures(frame):
    figure = plots.time_vs_seq_len(frame)
    drawn = texts(figure)
    assert any(t.startswith("full  α=2.00") for t in drawn)
    assert any(t.startswith("lsh  α=1.00, L*=1,000") for t in drawn)
    assert "L*≈1,000" in drawn  # the crossover's annotation by its star
    stars = [line for ax in figure.axes for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 2  # forward and forward+backward
    assert drawn.count("oom×2") == 2  # both seeds of exact attention at 8192, in each panel
    assert "linformer: skipped (no value)" in drawn
    for ax in figure.axes:
        assert ax.get_xscale() == ax.get_yscale() == "log"


def test_seeds_are_drawn_as_a_band(frame):
    figure = plots.memory_vs_seq_len(
        frame.assign(peak_memory_bytes=frame["peak_memory_bytes"] * (1 + 0.1 * frame["seed"]))
    )
    assert figure.axes[0].collections  # fill_between bands


def test_summary_table_reports_exponent_crossover_reach_and_failures(frame):
    table = tables.variant_summary(frame).frame.set_index("variant")
    assert table.loc["lsh", "α fwd+bwd"] == "1.00"
    assert table.loc["full", "α fwd"] == "2.00"
    assert table.loc["lsh", "L* fwd"] == table.loc["lsh", "L* fwd+bwd"] == "1,000"
    assert table.loc["lsh", "longest L ok"] == "8,192"
    assert table.loc["full", "longest L ok"] == "4,096"
    assert table.loc["full", "failed at"] == "oom at 8,192"
    assert table.loc["linformer", "failed at"] == "skipped at 1,024"
    # Memory and error at the longest length both measured series reached.
    assert table.loc["lsh", "peak memory @ L=4,096 (MiB)"] == "16.0"
    assert table.loc["lsh", "rel. error @ L=4,096"] == "0.1"
    failures = tables.failures(frame).frame
    assert set(failures["status"]) == {"oom", "skipped"}
    assert tables.depth_table(frame) is None  # depth was not swept


def test_every_figure_draws_for_results_without_any_measurement(frame):
    failed_only = frame[frame["status"] != "ok"]
    for name, (draw, _) in report.FIGURES.items():
        assert isinstance(draw(failed_only), Figure), name
