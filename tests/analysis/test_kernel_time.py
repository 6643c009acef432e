"""The kernel-time section (analysis.kernel_time): the per-variant and speed-up tables and the
kernel-time figure, on synthetic results with known exponents, crossover and failures."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from analysis import kernel_time, load, measured, peak_memory
from tests.analysis import suite_records
from tests.analysis.conftest import synthetic_records, texts


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def test_time_figure_has_exponents_crossover_and_failures(frame):
    figure = kernel_time.time_vs_seq_len(frame)
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


def test_summary_table_reports_exponent_crossover_reach_and_failures(frame):
    table = kernel_time.variant_summary(frame).frame.set_index("variant")
    assert table.loc["lsh", "α fwd+bwd"] == "1.00"
    assert table.loc["full", "α fwd"] == "2.00"
    assert table.loc["lsh", "L* fwd"] == table.loc["lsh", "L* fwd+bwd"] == "1,000"
    assert table.loc["lsh", "longest L ok"] == "8,192"
    assert table.loc["full", "longest L ok"] == "4,096"
    assert table.loc["full", "failed at"] == "oom at 8,192"
    assert table.loc["linformer", "failed at"] == "skipped at 1,024"
    # Memory and error at the longest length both measured series reached.
    assert table.loc["lsh", "step memory (MiB) @ L=4,096"] == "16.0"
    assert table.loc["lsh", "rel. error @ L=4,096"] == "0.1"
    assert table.loc["lsh", "fwd+bwd (ms) @ L=4,096"] == "123"  # 3 · 1e-2 · 4096, mean of seeds
    failures = measured.failures(frame).frame
    assert set(failures["status"]) == {"oom", "skipped"}
    assert peak_memory.depth_table(frame) is None  # depth was not swept


def two_variants(*families: tuple[str, float]) -> pd.DataFrame:
    """Exact attention and each (name, crossover length) family crossing it there."""
    return suite_records.crossing_sweep((("full", None), *families), (256, 512, 1024, 2048, 4096))


def test_crossover_labels_never_overlap():
    figure = kernel_time.time_vs_seq_len(
        two_variants(("blockwise", 1000.0), ("compressed", 1050.0))
    )
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # lays the labels out
    for ax in figure.axes:
        labels = [t for t in ax.texts if t.get_text().startswith("L*≈")]
        assert sorted(t.get_text() for t in labels) == ["L*≈1,000", "L*≈1,050"]
        first, second = (Text.get_window_extent(t, renderer) for t in labels)  # not the arrow
        assert not first.overlaps(second)


def test_a_series_with_no_measurement_has_no_crossover_rather_than_being_the_reference():
    # Records from before skipped jobs resolved their device keep the configured "auto", so no
    # exact series shares their context.
    rows = [
        {
            "status": "ok",
            "attention": attention,
            "task": "random_lm",
            "seq_len": n,
            "device": "cpu",
            "attn_fwd_ms": n / scale,
            "attn_fwd_bwd_ms": 2 * n / scale,
        }
        for n in (256, 512)
        for attention, scale in (("full", 100), ("lsh", 200))
    ]
    rows += [
        {
            "status": "skipped",
            "attention": "linformer",
            "task": "random_lm",
            "seq_len": n,
            "device": "auto",
            "error": "cannot be causal",
        }
        for n in (256, 512)
    ]
    table = kernel_time.variant_summary(load.tidy(pd.DataFrame(rows))).frame.set_index("variant")
    assert table.loc["full", "L* fwd"] == "reference"
    assert table.loc["lsh", "L* fwd"] == "≤256"
    assert table.loc["linformer", "L* fwd"] == "—"


def test_summary_leaves_out_columns_with_nothing_to_say_and_shows_the_swept_knobs():
    # The lsh preset: one length, no exact attention, no memory: no α, L* or memory columns.
    rows = [
        {
            "status": "ok",
            "attention": "lsh",
            "task": "random_lm",
            "seq_len": 4096,
            "attention.n_hashes": n_hashes,
            "attention.bucket_size": bucket,
            "attn_fwd_ms": n_hashes * 10.0,
            "attn_fwd_bwd_ms": n_hashes * 30.0,
            "approx_rel_error": 1 / n_hashes,
            "approx_reference_digest": "abc123",  # measured on trained activations
        }
        for n_hashes in (1, 2)
        for bucket in (32, 64)
    ]
    table = kernel_time.variant_summary(load.tidy(pd.DataFrame(rows))).frame
    assert list(table.columns) == [
        "variant",
        "n_hashes",
        "bucket_size",
        "fwd (ms) @ L=4,096",
        "fwd+bwd (ms) @ L=4,096",
        "rel. error @ L=4,096",
    ]
    assert table[["n_hashes", "bucket_size"]].values.tolist() == [
        ["1", "32"],
        ["1", "64"],
        ["2", "32"],
        ["2", "64"],
    ]
    assert list(table["fwd+bwd (ms) @ L=4,096"]) == ["30", "30", "60", "60"]
