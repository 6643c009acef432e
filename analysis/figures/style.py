"""The report's drawing kit, shared by every figure (`analysis.figures`,
`analysis.capacity`, `analysis.decode_report`): colours and styles per series, figures and
axes, lines with bands, failure markers at the wall, legends, and the marker of a panel with
nothing to draw.

Conventions shared by every figure:
  - one fixed colour per attention variant in every report (`variant_color`: registry order,
    exact attention black), shaded and given its own marker per configuration of that variant;
    one line style per block type (residual solid, reversible dashed, checkpoint dotted);
  - a line is the mean over seeds and repeats, its band the minimum..maximum across them;
  - a configuration that ended oom, timeout, skipped, error or diverged is a downward triangle at
    the top wall of the panel, labelled with its status: failures are data, never dropped;
  - a panel with nothing to draw says why (`message`); a figure with nothing drawn in any panel
    is one that `nothing_drawn` names, and the report leaves it out.
Figures are built with `matplotlib.figure.Figure`, not pyplot: no global state and no GUI, so
saving uses Agg (PNG) and the SVG backend whatever the session's backend is; in a notebook a
returned Figure displays inline.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis import load, series
from analysis.columns import ATTENTION, BLOCK, SEQ_LEN, STATUS

_WALL_STEP = 0.045  # axes-fraction stagger between failure markers of different series


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
    fig.suptitle(title, fontsize=11)
    return fig, axes[:panels]


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
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
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


def legend_below(ax: Axes, handles: list | None = None, *, y: float = -0.14, **options) -> None:
    """Every figure's legend: under the panel (its top at axes fraction `y`), centred, small and
    unframed; `handles` None takes the panel's labelled artists. `options` (ncol, handlelength,
    markerscale...) go to `Axes.legend`."""
    ax.legend(
        handles=handles,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, y),
        frameon=False,
        **options,
    )


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
) -> list[float]:
    """Mean line with min..max band per series, failures at the top wall, a legend below.

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
