"""The report's drawing kit, shared by every figure (each in its report section's module,
`analysis.report.SECTIONS`): colours and styles per series, figures and axes, lines with bands,
failure markers at the wall, legends, the layout pass every figure ends with, labels placed
only where they fit, and the marker of a panel with nothing to draw.

Conventions: one fixed colour per variant (`variant_color`) and one line style per block type;
a line is the mean over seeds and repeats, its band their range; a configuration that did not
end ok is a triangle at the panel's top wall, labelled with its status; a panel with nothing to
draw says why; every legend is below its panel, every figure ends in `finish`, and panel labels
go through `place_labels`. tests/analysis/test_figure_layout.py checks them by bounding box.
Figures are `matplotlib.figure.Figure`, not pyplot: no global state and no GUI.

The conventions in full: docs/internals-analysis.md, "figures/style".
"""

from __future__ import annotations

import textwrap
import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation, Text
from matplotlib.ticker import FuncFormatter, NullFormatter
from matplotlib.transforms import Bbox, ScaledTranslation, Transform

from analysis import load, series
from analysis.column_names import ATTENTION, BLOCK, SEQ_LEN, STATUS

_WALL_STEP = 0.045  # axes-fraction stagger between failure markers of different series


# Longer axis labels and titles wrap (a y label runs along a panel at least 3 inches tall).
_LABEL_CHARS, _YLABEL_CHARS = 70, 40


_EMPTY = "attnbench-nothing-drawn"  # gid of a panel that only says why it is empty


BLOCK_LINESTYLES = {"residual": "-", "reversible": "--", "checkpoint": ":"}


_OTHER_LINESTYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")


_SHADES = (0.0, 0.38, -0.35, 0.6, -0.55, 0.75)  # + lighter, - darker


# Qualitative colours for the variants after exact attention, in registry order: tab10 without
# its grey (too close to exact attention's black), then tab20's light shades without grey.
_PALETTE = tuple(
    [colormaps["tab10"](i) for i in range(10) if i != 7]
    + [colormaps["tab20"](i) for i in range(1, 20, 2) if i != 15]
)


def variant_color(name: str) -> tuple:
    """The colour of attention variant `name`, the same in every report: black for exact
    attention, then the palette in registry order; a name the registry does not know (records
    of a variant since removed or renamed) takes a colour from a hash of its name."""
    from variants.registry import attention_names

    if name == series.REFERENCE:
        return (0.0, 0.0, 0.0, 1.0)
    known = [n for n in attention_names() if n != series.REFERENCE]
    if name in known and known.index(name) < len(_PALETTE):
        return _PALETTE[known.index(name)]
    return _PALETTE[zlib.crc32(str(name).encode()) % len(_PALETTE)]


def series_styles(labelled: pd.DataFrame) -> dict[str, dict]:
    """Per series of `labelled`: its variant's colour, shaded per configuration of that variant,
    a line style per block type, and a marker per block type when several are drawn (else per
    configuration)."""
    styles: dict[str, dict] = {}
    if labelled.empty or "series" not in labelled:
        return styles
    rows = labelled.drop_duplicates("series")
    blocks = list(dict.fromkeys(rows[BLOCK].dropna())) if BLOCK in rows else []
    others = [b for b in blocks if b not in BLOCK_LINESTYLES]
    by_block = len(blocks) > 1  # then markers tell blocks apart too, else configurations
    for attention, members in rows.groupby(rows[ATTENTION].map(str), sort=False):
        # A configuration is the series without its block: its blocks share colour and marker.
        configs = members["series"].map(_without_block)
        order = list(dict.fromkeys(configs))
        for (_, row), config in zip(members.iterrows(), configs, strict=True):
            i = order.index(config)
            block = row.get(BLOCK)
            linestyle = BLOCK_LINESTYLES.get(
                block, _OTHER_LINESTYLES[others.index(block) % 3] if block in others else "-"
            )
            marker = blocks.index(block) if by_block and block in blocks else i
            styles[row["series"]] = {
                "color": shade(variant_color(attention), i),
                "marker": MARKERS[marker % len(MARKERS)],
                "linestyle": linestyle,
            }
    return styles


def _without_block(label: str) -> str:
    return " ".join(part for part in str(label).split() if not part.startswith("block="))


def shade(color, i: int) -> tuple:
    """`color` lightened (toward white) or darkened (toward black) for the i-th configuration."""
    rgb = np.array(to_rgb(color))
    amount = _SHADES[i % len(_SHADES)]
    if rgb.max() < 0.15:  # black: only lighter shades are visible
        amount = abs(amount)
    mixed = rgb + (1 - rgb) * amount if amount >= 0 else rgb * (1 + amount)
    return (*np.clip(mixed, 0, 1), 1.0)


def series_colors(labelled: pd.DataFrame) -> dict[str, tuple]:
    return {name: style["color"] for name, style in series_styles(labelled).items()}


def new_figure(panels: int, title: str, ncols: int = 2) -> tuple[Figure, list[Axes]]:
    """A figure of `panels` axes, at most `ncols` per row; unused grid cells are removed."""
    cols = min(panels, ncols)
    rows = -(-panels // cols)
    fig = Figure(figsize=(6.2 * cols, 5.6 * rows), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for extra in axes[panels:]:
        extra.remove()
    # At 11 points a character is about 0.09 inches: a long title wraps instead of being cut.
    fig.suptitle(_wrap(title, int(6.2 * cols / 0.09)), fontsize=11)
    return fig, axes[:panels]


def _wrap(text: str, width: int) -> str:
    """`text` with each of its lines wrapped at `width` characters."""
    return "\n".join(textwrap.fill(line, width) for line in str(text).split("\n"))


def label_axes(
    ax: Axes,
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    log: tuple[bool, bool],
    xs: Sequence[float] = (),
) -> None:
    """Scales, labels and grid; with `xs`, an x range holding them all, ticked at each if few.

    A panel without data (only a message) stays linear: a log axis cannot scale nothing.
    """
    if not ax.has_data():
        log = (False, False)
    ax.set_xscale("log" if log[0] else "linear")
    ax.set_yscale("log" if log[1] else "linear")
    for axis, is_log in zip((ax.xaxis, ax.yaxis), log, strict=True):
        if is_log:  # plain numbers: 1, 10, 100 and, between them, 2 and 5 (3 and 4 crowd)
            axis.set_major_formatter(FuncFormatter(plain_number))
            axis.set_minor_formatter(FuncFormatter(_two_or_five))
    values = sorted({v for v in xs if np.isfinite(v)})
    if values:
        low, high = values[0], values[-1]
        if log[0]:
            ax.set_xlim(low / 1.35, high * 1.35)
        else:
            pad = max((high - low) * 0.06, 0.5)
            ax.set_xlim(low - pad, high + pad)
        if len(values) <= 10:  # label the measured lengths themselves, not powers of ten
            ax.set_xticks(values, [load.format_value(v) for v in values])
            ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(_wrap(title, _LABEL_CHARS), fontsize=9)
    ax.set_xlabel(_wrap(xlabel, _LABEL_CHARS))
    ax.set_ylabel(_wrap(ylabel, _YLABEL_CHARS))
    ax.grid(True, which="major", alpha=0.3)


def plain_number(value: float, _position=None) -> str:
    return f"{value:g}"


def _two_or_five(value: float, _position=None) -> str:
    """A minor log tick's label if its leading digit is 2 or 5, else none."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** np.floor(np.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


def message(ax: Axes, text: str) -> None:
    """Say in the panel why it is empty (and mark it so: see `nothing_drawn`)."""
    ax.set_gid(_EMPTY)
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=9,
        color="dimgrey",
        wrap=True,
    )


_LEGEND_GAP_PT = 6  # between the x axis' tick labels and label and the legend under them
_MIN_PANEL_INCHES = (4.2, 3.0)  # a panel never shrinks below this to make room for legends
_GROW_ROUNDS = 4


def legend_below(ax: Axes, handles: list | None = None, **options) -> None:
    """Every figure's legend: under the panel, below its x tick labels and x label, centred,
    small and unframed; `handles` None takes the panel's labelled artists. `options` (ncol,
    handlelength, markerscale...) go to `Axes.legend`. Where exactly "below" is depends on how
    tall the x axis' labels are drawn: `finish` moves the legend there and makes room for it
    (and draws it in one column where two would be wider than the panel's share of the figure)."""
    legend = ax.legend(
        handles=handles,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=_below(ax, 36.0),
        frameon=False,
        **options,
    )
    legend._attnbench_below = (handles, options)  # to draw it again in one column


def _below(ax: Axes, points: float) -> Transform:
    """Axes fractions moved down by `points`: a place that keeps its distance from the panel's
    lower edge whatever size the panel is laid out at (and at any dpi)."""
    return ax.transAxes + ScaledTranslation(0, -points / 72, ax.figure.dpi_scale_trans)


def finish(figure: Figure) -> Figure:
    """Lay `figure` out so that nothing overlaps or is clipped: each panel's legend (`legend_below`)
    sits under that panel's x tick labels and x label, and the figure grows until every panel
    keeps at least `_MIN_PANEL_INCHES` and everything drawn (legends, labels, titles) fits the
    canvas. Every figure function returns its figure through here."""
    FigureCanvasAgg(figure)  # measuring text needs a renderer; savefig swaps canvases as needed
    with warnings.catch_warnings():  # a legend too big for the first size: grown below
        warnings.filterwarnings("ignore", "constrained_layout not applied")
        for _ in range(_GROW_ROUNDS):
            figure.draw_without_rendering()
            if _place_legends(figure, _renderer(figure)):
                figure.draw_without_rendering()
            width, height = figure.get_size_inches()
            grow_w, grow_h = _room_needed(figure, _renderer(figure))
            if grow_w <= 0.01 and grow_h <= 0.01:
                break
            figure.set_size_inches(width + grow_w, height + grow_h)
    return figure


def _place_legends(figure: Figure, renderer) -> bool:
    """Move each panel's legend just under its x axis' drawn labels; whether any moved."""
    moved = False
    spec = figure.axes[0].get_subplotspec() if figure.axes else None
    cols = spec.get_gridspec().ncols if spec is not None else 1
    for ax in figure.axes:
        legend = ax.get_legend()
        if legend is None or not hasattr(legend, "_attnbench_below"):
            continue  # not one of legend_below's
        handles, options = legend._attnbench_below
        share = figure.bbox.width / cols
        if options.get("ncol", 1) > 1 and legend.get_window_extent(renderer).width > share:
            legend_below(ax, handles, **{**options, "ncol": 1})
            legend = ax.get_legend()
            moved = True
        drawn = ax.xaxis.get_tightbbox(renderer)
        depth = max(ax.bbox.y0 - drawn.y0, 0.0) if drawn is not None else 0.0
        points = depth * 72 / figure.dpi + _LEGEND_GAP_PT
        if abs(getattr(legend, "_attnbench_gap", -1.0) - points) > 0.5:
            legend.set_bbox_to_anchor((0.5, 0.0), transform=_below(ax, points))
            legend._attnbench_gap = points
            moved = True
    return moved


def _room_needed(figure: Figure, renderer) -> tuple[float, float]:
    """Inches to add to the figure's width and height: what drawn artists overhang the canvas
    by, or what the narrowest / shortest panel lacks of `_MIN_PANEL_INCHES` per grid column/row."""
    dpi = figure.dpi
    drawn = figure.get_tightbbox(renderer)  # inches
    width, height = figure.get_size_inches()
    over_w = max(drawn.x1, width) - min(drawn.x0, 0.0) - width
    over_h = max(drawn.y1, height) - min(drawn.y0, 0.0) - height
    spec = figure.axes[0].get_subplotspec() if figure.axes else None
    if spec is None:
        return max(over_w, 0.0), max(over_h, 0.0)
    rows, cols = spec.get_gridspec().get_geometry()
    short_w = _MIN_PANEL_INCHES[0] - min(ax.bbox.width for ax in figure.axes) / dpi
    short_h = _MIN_PANEL_INCHES[1] - min(ax.bbox.height for ax in figure.axes) / dpi
    return max(over_w, short_w * cols, 0.0), max(over_h, short_h * rows, 0.0)


# A point's label: upper right of it, else lower right, upper left, lower left.
AROUND_POINT = tuple(
    ((dx, dy), "offset points", ha, va)
    for dx, dy, ha, va in (
        (4, 3, "left", "bottom"),
        (4, -3, "left", "top"),
        (-4, 3, "right", "bottom"),
        (-4, -3, "right", "top"),
    )
)


def place_labels(
    ax: Axes, labels: Sequence[tuple[Annotation, Sequence[tuple]]], avoid: Sequence = ()
) -> list[Annotation]:
    """Labels drawn on a panel only where they fit: each label, in order, takes the first of its
    candidate places — (xytext, textcoords, ha, va) — where it lies inside the panel and overlaps
    no label kept before it and no artist of `avoid` (markers); a label with no such place is
    removed. Returns the removed ones, for the figure to say where their text went instead.
    Call it on a `finish`ed figure: it measures the layout drawn there."""
    renderer = _renderer(ax.figure)
    inside = ax.bbox
    taken = [artist.get_window_extent(renderer) for artist in avoid]
    left_out = []
    for label, candidates in labels:
        for xytext, textcoords, ha, va in candidates:
            label.xyann = xytext
            label.set(anncoords=textcoords, horizontalalignment=ha, verticalalignment=va)
            box = _label_extent(label, renderer)
            fits = (
                inside.x0 <= box.x0
                and box.x1 <= inside.x1
                and inside.y0 <= box.y0
                and box.y1 <= inside.y1
            )
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
        else:
            label.remove()
            left_out.append(label)
    return left_out


def _renderer(figure: Figure):
    canvas = figure.canvas
    return (canvas if hasattr(canvas, "get_renderer") else FigureCanvasAgg(figure)).get_renderer()


def _label_extent(label: Annotation, renderer) -> Bbox:
    """A label's text with its box (if any) around it, where it is drawn now."""
    label.update_positions(renderer)
    box = Text.get_window_extent(label, renderer)
    patch = label.get_bbox_patch()
    if patch is not None:
        pad = patch.get_boxstyle().pad * label.get_size() * renderer.points_to_pixels(1)
        box = box.padded(pad + 1)
    return box


def nothing_drawn(figure: Figure) -> str | None:
    """Why `figure` shows nothing (the text of its empty panels), or None if it shows data."""
    if not figure.axes or any(ax.get_gid() != _EMPTY for ax in figure.axes):
        return None
    reasons = [t.get_text() for ax in figure.axes for t in ax.texts]
    return "; ".join(dict.fromkeys(" ".join(r.split()) for r in reasons if r))


def draw_series(
    ax: Axes,
    labelled: pd.DataFrame,
    x: str,
    y: str,
    notes: dict[str, str] | None = None,
    min_points: int = 1,
    extra_handles: Sequence = (),
) -> list[float]:
    """Mean line with min..max band per series, failures at the top wall, a legend below
    (ending with `extra_handles`: what else the panel marks).

    With `min_points` 2 (a curve over seq_len), a panel where no series has two points says
    so instead of drawing lone dots. Returns every x drawn (values and failures), for `label_axes`
    to fit the x range to; nothing when the panel is left empty.
    """
    stats = series.mean_spread(labelled, x, y)
    failed = series.failures(labelled, x)
    if stats.empty:  # failures alone make no figure: the report's failures table lists them
        failures_note = "\n(failed ones: see the table 'Not measured')" if len(failed) else ""
        message(ax, f"no {y} in these results{failures_note}")
        return []
    if stats.groupby("series").size().max() < min_points:
        lengths = ", ".join(load.format_value(v) for v in sorted(stats[x].unique()))
        message(ax, f"measured at one {x} only ({lengths}): no curve to draw")
        return []
    order = series.series_order(labelled) if len(labelled) else []
    styles = series_styles(labelled)
    handles = []
    _draw_failures(ax, failed, x, {s: st["color"] for s, st in styles.items()}, order)
    for name in order:
        points = stats[stats["series"] == name]
        text = name + (f"  {notes[name]}" if notes and notes.get(name) else "")
        if not points.empty:
            # Exact attention on top: the line every other is read against stays visible.
            exact = name.startswith(series.REFERENCE)
            (line,) = ax.plot(
                points[x],
                points["mean"],
                **styles[name],
                markersize=4,
                linewidth=2.0 if exact else 1.4,
                zorder=3 if exact else 2,
                label=text,
            )
            if (points["n"] > 1).any():
                ax.fill_between(
                    points[x],
                    points["lo"],
                    points["hi"],
                    color=styles[name]["color"],
                    alpha=0.2,
                    linewidth=0,
                )
            handles.append(line)
        rows = failed[failed["series"] == name]
        if points.empty and not rows.empty:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=styles[name]["color"],
                    marker="v",
                    linestyle="none",
                    label=f"{name}: {status_text(rows)} (no value)",
                )
            )
    if not handles:
        message(ax, f"no {y} in these results")
        return []
    handles += list(extra_handles)
    legend_below(ax, handles, ncol=1 if len(handles) < 8 else 2, handlelength=3)
    return [float(v) for v in (*stats[x], *failed[x])]


def _draw_failures(
    ax: Axes, failed: pd.DataFrame, x: str, colors: dict, order: Sequence[str]
) -> None:
    """A downward triangle at the top wall per failed series and x, labelled with its status.

    Series failing at the same x are stacked down from the wall in legend order.
    """
    wall = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for xv, at_x in failed.groupby(x):
        for slot, name in enumerate(s for s in order if (at_x["series"] == s).any()):
            rows = at_x[at_x["series"] == name]
            text = ",".join(
                f"{status}×{n}" if n > 1 else status
                for status, n in zip(rows[STATUS], rows["n"], strict=True)
            )
            y = 0.97 - slot * _WALL_STEP
            ax.plot(xv, y, "v", color=colors[name], markersize=6, transform=wall, clip_on=False)
            ax.annotate(
                text,
                (xv, y),
                xycoords=wall,
                fontsize=6,
                color=colors[name],
                xytext=(4, -2),
                textcoords="offset points",
            )


def status_text(rows: pd.DataFrame) -> str:
    statuses = rows.loc[rows[STATUS] != "ok", STATUS]
    return ",".join(dict.fromkeys(statuses))


def pick_length(frame: pd.DataFrame, metric: str) -> float | None:
    """The seq_len with the most status-ok values of `metric` (the longest among ties)."""
    ok = frame[(frame[STATUS] == "ok") & frame[metric].notna()]
    if ok.empty:
        return None
    counts = ok.groupby(SEQ_LEN)["variant"].nunique()
    best = counts[counts == counts.max()].index
    return float(max(best))
