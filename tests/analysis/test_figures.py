"""Figures (analysis.figures) and tables on synthetic results with known exponents, crossover
and failures."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from analysis import figures, load, measured, memory_depth, report, scaling_fits, series
from analysis.figures import quality
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
    fits = scaling_fits.scaling_fits(labelled, keys, "attn_fwd_bwd_ms")
    assert fits["full"].power_law.exponent == pytest.approx(2.0, abs=1e-9)
    assert fits["lsh"].power_law.exponent == pytest.approx(1.0, abs=1e-9)
    assert fits["full"].crossover is None  # the reference itself
    assert fits["lsh"].crossover.kind == "crossed"
    assert fits["lsh"].crossover.length == pytest.approx(1000.0, rel=1e-6)


def test_time_figure_has_exponents_crossover_and_failures(frame):
    figure = figures.time_vs_seq_len(frame)
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
    figure = figures.memory_vs_seq_len(
        frame.assign(peak_memory_bytes=frame["peak_memory_bytes"] * (1 + 0.1 * frame["seed"]))
    )
    assert figure.axes[0].collections  # fill_between bands


def test_summary_table_reports_exponent_crossover_reach_and_failures(frame):
    table = scaling_fits.variant_summary(frame).frame.set_index("variant")
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
    assert memory_depth.depth_table(frame) is None  # depth was not swept


def test_every_figure_draws_for_results_without_any_measurement(frame, tmp_path):
    failed_only = frame[frame["status"] != "ok"]
    for name, spec in report.FIGURES.items():
        figure = spec.draw(failed_only)
        assert figures.nothing_drawn(figure), name  # so the report leaves it out
        figure.savefig(tmp_path / f"{name}.png")  # and it still saves: no log axis of nothing


def two_variants(*families: tuple[str, float]) -> pd.DataFrame:
    """Synthetic scaling records: exact attention (1e-5·L²) and each (name, crossover length)
    family costing 1e-5·L²·(crossover/L)^0.9·... so that it crosses exact attention there."""
    records = []
    for length in (256, 512, 1024, 2048, 4096):
        for name, crossover in (("full", None), *families):
            cost = 1e-5 * length**2 if crossover is None else 1e-5 * crossover * length
            records.append(
                {
                    "status": "ok",
                    "attention": name,
                    "block": "residual",
                    "task": "random_lm",
                    "seq_len": length,
                    "attn_fwd_ms": cost,
                    "attn_fwd_bwd_ms": 3 * cost,
                    "timestamp": "2026-01-01T00:00:00",
                }
            )
    return load.tidy(pd.DataFrame(records))


def test_crossover_labels_never_overlap():
    figure = figures.time_vs_seq_len(two_variants(("blockwise", 1000.0), ("compressed", 1050.0)))
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # lays the labels out
    for ax in figure.axes:
        labels = [t for t in ax.texts if t.get_text().startswith("L*≈")]
        assert sorted(t.get_text() for t in labels) == ["L*≈1,000", "L*≈1,050"]
        first, second = (Text.get_window_extent(t, renderer) for t in labels)  # not the arrow
        assert not first.overlaps(second)


def line_colors(figure: Figure) -> dict[str, tuple]:
    lines = [line for ax in figure.axes[:1] for line in ax.get_lines() if line.get_label()]
    return {line.get_label().split()[0]: line.get_color() for line in lines}


def test_a_variant_keeps_its_colour_in_every_report():
    one = line_colors(figures.time_vs_seq_len(two_variants(("compressed", 900.0), ("lsh", 1e3))))
    two = line_colors(figures.time_vs_seq_len(two_variants(("lsh", 1e3), ("blockwise", 800.0))))
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
    figure = figures.depth(load.tidy(pd.DataFrame(records)))
    styles = {line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()}
    assert styles == {
        "full block=residual": "-",
        "full block=reversible": "--",
        "full block=checkpoint": ":",
    }


def test_error_vs_knob_is_left_out_when_no_knob_was_swept(frame):
    assert "no variant's option was swept" in figures.nothing_drawn(figures.error_vs_knob(frame))
    swept = frame.assign(**{"attention.n_hashes": frame["seed"] + 1})  # 1 and 2 hashes
    assert figures.nothing_drawn(figures.error_vs_knob(swept)) is None


def test_curves_of_a_few_random_token_steps_are_not_drawn_and_the_report_says_why(frame):
    """The fixture's jobs train 3 steps of a random-token LM: noise, not learning."""
    assert "no run trained 100 steps or more" in figures.why_no_curves(frame)
    assert figures.why_no_curves(frame.assign(task="recall", trained_steps=99)) is not None
    learned = frame.assign(task="recall", trained_steps=100)
    assert figures.why_no_curves(learned) is None
    long_random = frame.assign(trained_steps=1000)  # random tokens stay noise at any length
    assert figures.why_no_curves(long_random) is not None


def test_training_curve_legend_says_how_train_and_eval_are_drawn(frame):
    frame = frame.assign(task="recall", trained_steps=200)  # a run whose curve means something
    at_256 = frame[(frame["seq_len"] == 256) & (frame["seed"] == 0)]
    first = at_256.index[0]
    curves = pd.DataFrame(
        [(first, step, "train/loss", 5.0 - step / 10) for step in range(4)]
        + [(first, 3, "eval/loss", 5.2)],  # evaluated once: one square, no dashes to see
        columns=["row", "step", "metric", "value"],
    )
    figure = figures.training_curves(frame, curves=curves, seq_len=256)
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert legend[-2:] == ["train loss (25-step mean)", "eval loss"]
    assert figure.axes[0].get_title() == "per step"


def test_a_flagged_flop_fraction_is_drawn_hollow(frame):
    flagged = frame.assign(
        matmul_peak_gflops_per_s=100.0,
        attn_fwd_gflops_per_s=50.0,
        attn_fwd_bwd_gflops_per_s=50.0,
        attn_fwd_bwd_matmul_fraction=0.5,
        matmul_fraction_warning=False,
    )
    at = (flagged["attention"] == "lsh") & (flagged["seq_len"] == 1024)
    flagged.loc[at, ["attn_fwd_bwd_matmul_fraction", "matmul_fraction_warning"]] = [1.4, True]
    figure = figures.flops_fraction(flagged)
    hollow = [
        line
        for line in figure.axes[1].get_lines()
        if line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))
    ]
    assert len(hollow) == 1  # lsh's two seeds at 1024, nothing else
    assert set(hollow[0].get_xdata()) == {1024} and set(hollow[0].get_ydata()) == {1.4}
    assert any(t.startswith("hollow: above 1.05") for t in texts(figure))


def test_training_curves_draw_each_variants_chosen_rate_of_a_grid_only():
    """The final-loss panel shows the rate chosen on held-out loss, as the quality table does:
    no whisker spanning the grid's rates."""
    rows = [
        {"attention": a, "train.lr": lr, "valid_loss": v, "train_loss": t, "eval_loss": e}
        for a, lr, v, t, e in (
            ("full", 1e-3, 1.9, 2.0, 1.95), ("full", 1e-2, 2.3, 2.4, 2.35),
            ("linear", 1e-3, 2.5, 2.6, 2.55), ("linear", 1e-2, 2.4, 2.5, 2.45),
        )
    ]  # fmt: skip
    base = {"status": "ok", "task": "text", "seq_len": 256, "seed": 0, "trained_steps": 400}
    frame = load.tidy(pd.DataFrame([{**base, **row} for row in rows]))
    figure = figures.training_curves(frame, curves=pd.DataFrame(), seq_len=256)
    final_ax = figure.axes[1]
    drawn = sorted(
        round(float(line.get_ydata()[0]), 6)
        for line in final_ax.lines
        if line.get_marker() in ("o", "s") and len(line.get_ydata()) == 1
    )
    assert drawn == [1.95, 2.0, 2.45, 2.5]  # full at 1e-3, linear at 1e-2


def test_a_mixtures_points_draw_one_curve_the_jobs_own_and_stages_stay():
    """A recall mixture's evaluation points (`<job>/n_pairs=P`) share the job's model and
    history: one record per run and length is drawn; a curriculum stage (another length) stays."""
    base = {"status": "ok", "task": "recall", "seed": 0, "trained_steps": 400, "sweep": "s"}
    rows = [
        {"job": "0/n_pairs=8", "task.n_pairs": 8, "seq_len": 256},  # listed before its job
        {"job": "0", "task.n_pairs": 4, "seq_len": 256},
        {"job": "0/n_pairs=16", "task.n_pairs": 16, "seq_len": 256},
        {"job": "1/64", "task.n_pairs": 4, "seq_len": 64},  # a stage: another length
        {"job": "1", "task.n_pairs": 4, "seq_len": 256},
    ]
    frame = pd.DataFrame([{**base, "attention": "full", **row} for row in rows])
    kept = figures.one_record_per_run(frame)
    assert sorted(kept["job"]) == ["0", "1", "1/64"]


def test_training_loss_is_drawn_as_a_running_mean():
    """A mixture's per-step loss alternates with the batches' counts; the curve is its
    running mean over `SMOOTH_STEPS` steps (the first points over the steps so far)."""
    base = {"status": "ok", "task": "recall", "seq_len": 256, "seed": 0, "trained_steps": 200}
    frame = load.tidy(pd.DataFrame([{**base, "attention": "full", "train_loss": 1.0}]))
    swings = [(frame.index[0], step, "train/loss", 2.0 if step % 2 else 0.0) for step in range(60)]
    curves = pd.DataFrame(swings, columns=["row", "step", "metric", "value"])
    figure = figures.training_curves(frame, curves=curves, seq_len=256)
    (line,) = [ln for ln in figure.axes[0].get_lines() if len(ln.get_xdata()) == 60]
    y = line.get_ydata()
    assert y[0] == 0.0 and y[1] == 1.0  # mean of (0), of (0, 2)
    window = quality.SMOOTH_STEPS
    assert all(abs(v - 1.0) <= 1 / window + 1e-9 for v in y[window:])  # the swing averaged out
