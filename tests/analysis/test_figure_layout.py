"""Every report figure, drawn from the figure tests' frames, checked for layout by bounding box:
legends overlap no label, tick label or other panel and lie below their own panel; labels,
titles, tick labels and legends lie inside the canvas (nothing clipped); labels placed on a
plot (crossovers, failure statuses) do not overlap each other.

A case is one figure from one frame, so a failure names the figure and the frame."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from itertools import combinations

import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from analysis import capacity, decode_report, figures, frontier, load, report, training_curves
from tests.analysis import suite_records
from tests.analysis.conftest import FIXTURE, synthetic_records
from tests.analysis.test_capacity import _mixture_sweep
from tests.analysis.test_decode_report import decode_records
from tests.analysis.test_frontier import frontier_sweep
from tests.analysis.test_quality_by_length import long_range_records

TOLERANCE = 1.0  # pixels: extents are rounded to the pixel grid


def fixture_frame() -> pd.DataFrame:
    return load.load_results([FIXTURE])


def synthetic_frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(synthetic_records()))


def many_crossings() -> pd.DataFrame:
    """Exact attention (1e-5·L²) and every other registered variant, each crossing it at its own
    length between 300 and 1,200 tokens (a main job's scaling sweep): the crowded case."""
    from variants import attention_names

    others = [name for name in attention_names() if name != "full"]
    crossings = {name: 300 * 4 ** (i / (len(others) - 1)) for i, name in enumerate(others)}

    def costs(length: int, cost: float) -> dict:
        return {
            "speedup_vs_sdpa": 1e-5 * length**2 / cost,
            "peak_memory_bytes": 2**20 * length / 256,
            "attn_fwd_bwd_peak_bytes": 2**19 * length / 256,
        }

    lengths = (128, 256, 512, 1024, 2048, 4096)
    return suite_records.crossing_sweep((("full", None), *crossings.items()), lengths, costs)


def many_trained() -> pd.DataFrame:
    """Every registered variant trained on recall at 512 and 1,024 tokens (a main job's quality
    half): several points crowd near chance at similar times, and the legend is long."""
    from variants import attention_names

    rows = []
    for i, name in enumerate(attention_names()):
        for length in (512, 1024):
            last = length == 1024
            rows.append(
                {
                    "sweep": "long_range_quick",
                    "config_hash": f"{name}-{length}",
                    "status": "ok",
                    "attention": name,
                    "task": "long_recall",
                    "task.n_values": 16,
                    "block": "residual",
                    "seq_len": length,
                    "causal": name != "linformer",
                    "seed": 0,
                    "eval_accuracy": 1.0 if i == 0 else (0.05 + 0.01 * i if i % 2 else 0.9),
                    "attn_fwd_bwd_ms": (5.0 + i % 4) if last else None,
                    "attn_fwd_bwd_peak_bytes": 2**20 * (2 + i % 3) if last else None,
                    "trained_steps": 550,  # "not learned in 550 steps (control ...)"
                }
            )
    return load.tidy(pd.DataFrame(rows))


def error_quality() -> pd.DataFrame:
    """The long-range records without accuracy: the trade-off's y is the error on trained
    activations, the longest y label any figure draws."""
    frame = long_range_records().assign(task="random_lm", eval_accuracy=None)
    frame["approx_rel_error"] = frame["attn_fwd_bwd_ms"].map(lambda t: None if pd.isna(t) else 0.1)
    return frame


def recall_curves() -> Figure:
    """The training-curve test's case: recall runs of 200 steps, with a per-step history."""
    frame = synthetic_frame().assign(task="recall", trained_steps=200)
    at_256 = frame[(frame["seq_len"] == 256) & (frame["seed"] == 0)]
    first = at_256.index[0]
    curves = pd.DataFrame(
        [(first, step, "train/loss", 5.0 - step / 10) for step in range(4)]
        + [(first, 3, "eval/loss", 5.2)],
        columns=["row", "step", "metric", "value"],
    )
    return training_curves.training_curves(frame, curves=curves, seq_len=256)


def flagged_fractions() -> pd.DataFrame:
    """The flop-fraction test's case: one fraction above 1.05, drawn hollow with its note."""
    frame = synthetic_frame().assign(
        attn_fwd_bwd_matmul_fraction=0.5, matmul_fraction_warning=False
    )
    at = (frame["attention"] == "lsh") & (frame["seq_len"] == 1024)
    frame.loc[at, ["attn_fwd_bwd_matmul_fraction", "matmul_fraction_warning"]] = [1.4, True]
    return frame


def knob_swept() -> pd.DataFrame:
    return synthetic_frame().assign(**{"attention.n_hashes": lambda f: f["seed"] + 1})


def _draw(name: str, frame: Callable[[], pd.DataFrame]) -> Callable[[], Figure | None]:
    """The report's figure `name` of `frame`, or None where the report would not draw it."""

    def build() -> Figure | None:
        records = frame()
        if report.not_applicable(name, records) is not None:
            return None
        return report.FIGURES[name].draw(records)

    return build


# case id -> the figure. Ids start with the report's figure name.
CASES: dict[str, Callable[[], Figure | None]] = {
    **{f"{name}:fixture": _draw(name, fixture_frame) for name in report.FIGURES},
    **{f"{name}:synthetic": _draw(name, synthetic_frame) for name in report.FIGURES},
    "time_vs_seq_len:15 crossings": _draw("time_vs_seq_len", many_crossings),
    "memory_vs_seq_len:16 variants": _draw("memory_vs_seq_len", many_crossings),
    "flops_fraction:flagged": _draw("flops_fraction", flagged_fractions),
    "error_vs_knob:swept": _draw("error_vs_knob", knob_swept),
    "training_curves:recall": recall_curves,
    "accuracy_vs_seq_len:long range": _draw("accuracy_vs_seq_len", long_range_records),
    "tradeoff:accuracy": _draw("tradeoff", long_range_records),
    "tradeoff:error": _draw("tradeoff", error_quality),
    "tradeoff:16 variants": _draw("tradeoff", many_trained),
    "accuracy_vs_seq_len:16 variants": _draw("accuracy_vs_seq_len", many_trained),
    "accuracy_vs_pairs:capacity": lambda: capacity.accuracy_vs_pairs(_mixture_sweep()),
    "recall_vs_state:frontier": lambda: frontier.recall_vs_state(frontier_sweep()),
    "decode_vs_context:decode": lambda: decode_report.decode_vs_context(
        load.tidy(pd.DataFrame(decode_records()))
    ),
}


def test_every_report_figure_has_a_case_that_draws_something():
    drawn = set()
    for case, build in CASES.items():
        figure = build()
        if figure is not None and figures.nothing_drawn(figure) is None:
            drawn.add(case.split(":")[0])
    assert drawn == set(report.FIGURES)


@pytest.fixture(params=list(CASES), scope="module")
def drawn(request):
    """(figure, renderer) after a full Agg draw; a figure the report would leave out (not
    applicable, or nothing drawn) is skipped."""
    figure = CASES[request.param]()
    if figure is None or figures.nothing_drawn(figure) is not None:
        pytest.skip("the report does not draw this figure from this frame")
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return figure, canvas.get_renderer()


def _extent(artist, renderer) -> Bbox | None:
    """`artist`'s window extent (a Text's own, not its arrow's), None if not drawn or empty."""
    if not artist.get_visible():
        return None
    if isinstance(artist, Text):
        if not artist.get_text().strip():
            return None
        box = Text.get_window_extent(artist, renderer)
    else:
        box = artist.get_window_extent(renderer)
    return box if box.width > 0 and box.height > 0 else None


def _tick_labels(ax: Axes) -> list[Text]:
    """The tick labels of both axes that are drawn: inside the view interval, with text."""
    labels = []
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        slack = (high - low) * 1e-9
        for tick in (*axis.get_major_ticks(), *axis.get_minor_ticks()):
            if low - slack <= tick.get_loc() <= high + slack and tick.label1.get_visible():
                labels.append(tick.label1)
    return labels


def _labelled(figure: Figure, renderer) -> list[tuple[str, Bbox]]:
    """(description, extent) of every axis label, title and tick label of every panel."""
    found = []
    for i, ax in enumerate(figure.axes):
        parts = [
            ("x label", ax.xaxis.label),
            ("y label", ax.yaxis.label),
            *((f"title {t.get_text()!r}", t) for t in (ax.title, ax._left_title, ax._right_title)),
            *((f"tick label {t.get_text()!r}", t) for t in _tick_labels(ax)),
        ]
        for what, text in parts:
            box = _extent(text, renderer)
            if box is not None:
                found.append((f"panel {i} {what}", box))
    return found


def _legends(figure: Figure) -> list[tuple[int | None, object]]:
    """(panel index or None for a figure legend, legend)."""
    found = [(i, ax.get_legend()) for i, ax in enumerate(figure.axes) if ax.get_legend()]
    return found + [(None, legend) for legend in figure.legends]


def legend_problems(figure: Figure, renderer) -> list[str]:
    """A legend covering a label, a tick label or a panel (its own included: legends go below)."""
    problems = []
    for owner, legend in _legends(figure):
        box = legend.get_window_extent(renderer)
        for what, other in _labelled(figure, renderer):
            if box.overlaps(other):
                problems.append(f"legend of panel {owner} covers {what}")
        for i, ax in enumerate(figure.axes):
            if box.overlaps(ax.get_window_extent(renderer)):
                where = "its own panel (not below it)" if i == owner else f"panel {i}"
                problems.append(f"legend of panel {owner} covers {where}")
    return problems


def clipped(figure: Figure, renderer) -> list[str]:
    """Labels, titles, tick labels, legends and texts placed on a panel reaching past the canvas."""
    canvas = figure.bbox.padded(TOLERANCE)
    parts = _labelled(figure, renderer) + [
        (f"legend of panel {owner}", legend.get_window_extent(renderer))
        for owner, legend in _legends(figure)
    ]
    parts += [
        (f"panel {i} text {text.get_text()!r}", _extent(text, renderer))
        for i, ax in enumerate(figure.axes)
        for text in ax.texts
    ]
    parts += [("suptitle", _extent(figure._suptitle, renderer))] if figure._suptitle else []
    return [
        f"{what} is clipped: {tuple(round(v) for v in box.extents)} outside the canvas "
        f"{tuple(round(v) for v in figure.bbox.extents)}"
        for what, box in parts
        if box is not None
        and not (canvas.contains(box.x0, box.y0) and canvas.contains(box.x1, box.y1))
    ]


def placed_overlaps(figure: Figure, renderer) -> list[str]:
    """Texts placed on one panel (crossover labels, failure statuses, notes; with their boxes)
    that overlap each other or a crossover's star."""
    problems = []
    for i, ax in enumerate(figure.axes):
        placed = [(t, _boxed_extent(t, renderer)) for t in ax.texts]
        placed = [(t, box) for t, box in placed if box is not None]
        for (a, box_a), (b, box_b) in combinations(placed, 2):
            if box_a.overlaps(box_b):
                problems.append(f"panel {i}: {a.get_text()!r} overlaps {b.get_text()!r}")
        stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
        for (text, box), star in itertools.product(placed, stars):
            if box.overlaps(star.get_window_extent(renderer)):
                where = (float(star.get_xdata()[0]), float(star.get_ydata()[0]))
                problems.append(f"panel {i}: {text.get_text()!r} covers the star at {where}")
    return problems


def _boxed_extent(text: Text, renderer) -> Bbox | None:
    """A placed text's extent with the box drawn around it, if any."""
    box = _extent(text, renderer)
    patch = text.get_bbox_patch()
    return patch.get_window_extent(renderer) if box is not None and patch else box


def test_legends_overlap_no_label_and_no_panel(drawn):
    problems = legend_problems(*drawn)
    assert not problems, "\n".join(problems)


def test_labels_titles_ticks_legends_and_placed_texts_lie_inside_the_canvas(drawn):
    problems = clipped(*drawn)
    assert not problems, "\n".join(problems)


def test_labels_placed_on_a_plot_do_not_overlap_each_other(drawn):
    problems = placed_overlaps(*drawn)
    assert not problems, "\n".join(problems)
