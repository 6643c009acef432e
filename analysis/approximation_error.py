"""The approximation-error section of report.md (`SECTION`): each variant's error against exact
attention on a trained reference's activations, against sequence length (beside the kernel swap's
Δ bits/byte, `error_vs_seq_len`), against its knob (`error_vs_knob`) and against the kernel's time
(`error_vs_time`); and the knob table: whether the error falls as the knob gets finer
(`error_by_knob`). The knobs themselves: each variant's `knobs` (`series.knobs()`)."""

from __future__ import annotations

import textwrap

import pandas as pd
from matplotlib.figure import Figure

from analysis import load, series, table_command
from analysis.column_names import (
    APPROX_REL_ERROR,
    ATTENTION,
    ATTN_FWD_BWD_MS,
    SEQ_LEN,
    STATUS,
    SWAP_DELTA_BITS_PER_BYTE,
)
from analysis.figures import style
from analysis.markdown_table import Table, format_length
from analysis.section import FigureSpec, Section, TableSpec


def error_vs_seq_len(frame: pd.DataFrame) -> Figure:
    """Relative approximation error ‖out − exact‖/‖exact‖ against seq_len (0 = exact), and
    beside it the kernel swap: the reference's held-out bits/byte change when the kernel
    replaces exact attention in it (0 = no loss), where the records have it."""
    labelled, _ = series.with_series(frame, x=SEQ_LEN)
    swap = SWAP_DELTA_BITS_PER_BYTE
    has_swap = swap in labelled and labelled[swap].notna().any()
    fig, axes = style.new_figure(2 if has_swap else 1, "Approximation error vs sequence length")
    xs = style.draw_series(axes[0], labelled, SEQ_LEN, APPROX_REL_ERROR, min_points=2)
    style.label_axes(
        axes[0],
        "on the reference's q, k, v",
        SEQ_LEN,
        "relative error (Frobenius)",
        log=(True, False),
        xs=xs,
    )
    if has_swap:
        xs = style.draw_series(axes[1], labelled, SEQ_LEN, swap, min_points=2)
        style.label_axes(
            axes[1],
            "kernel swap into the reference",
            SEQ_LEN,
            "Δ bits/byte (held-out text)",
            log=(True, False),
            xs=xs,
        )
    return style.finish(fig)


def error_vs_knob(frame: pd.DataFrame) -> Figure:
    """Approximation error against each variant's knob (n_hashes, window, n_features, k, ...).

    One panel per approximate variant with an option that takes several values (its first knob
    of `series.knobs()`, or its first varying option); lines are the other options and the lengths.
    Variants with knobs measured at one knob value only are named under the title.
    """
    swept, fixed = [], []
    registered = series.knobs()
    approximate = (a for a in dict.fromkeys(frame[ATTENTION].dropna()) if a != series.REFERENCE)
    for attention in approximate:  # exact attention's error is 0 whatever its options
        knobs = _knobs(frame, attention)
        if knobs:
            swept.append((attention, knobs))
        elif attention in registered and registered[attention][0] in frame:
            rows = frame[frame[ATTENTION] == attention]
            knob = registered[attention][0]
            values = rows[knob].dropna().map(load.format_value).unique()
            fixed.append(f"{attention} {knob.split('.', 1)[1]}={','.join(values) or 'none'}")
    cols = min(max(len(swept), 1), 3)
    title = "Approximation error vs each variant's knob"
    if fixed:
        title += "\n" + textwrap.fill(f"(one value only: {'; '.join(fixed)})", 75 * cols)
    fig, axes = style.new_figure(max(len(swept), 1), title, ncols=3)
    if not swept:
        style.message(
            axes[0],
            "no variant's option was swept in these results\n"
            "(e.g. +experiment=lsh, +experiment=linformer)",
        )
    for ax, (attention, (knob, *others)) in zip(axes, swept, strict=False):
        rows = frame[(frame[ATTENTION] == attention) & frame[knob].notna()]
        labelled, _ = series.with_series(
            rows.assign(variant=attention), x=knob, context=(*others, *series.context_columns(rows))
        )
        values = sorted(labelled[knob].unique(), key=_knob_sort_key)
        labelled["knob_position"] = labelled[knob].map({v: i for i, v in enumerate(values)})
        style.draw_series(ax, labelled, "knob_position", APPROX_REL_ERROR)
        style.label_axes(ax, attention, knob.split(".", 1)[1], "relative error", log=(False, False))
        ax.set_xticks(range(len(values)), [load.format_value(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    return style.finish(fig)


def error_vs_time(frame: pd.DataFrame, seq_len: float | None = None) -> Figure:
    """What accuracy costs: approximation error against the kernel's forward+backward time at
    one seq_len, one point per configuration; a variant's points are joined along its first
    knob (e.g. LSH's n_hashes, one line per bucket_size), each labelled with the knob's value.

    Default length: the one with the most configurations measured, the longest on a tie.
    """
    x, y = ATTN_FWD_BWD_MS, APPROX_REL_ERROR
    measured = frame[frame[x].notna() & frame[y].notna()]
    seq_len = style.pick_length(measured, x) if seq_len is None else seq_len
    at_length = frame[frame[SEQ_LEN] == seq_len] if seq_len is not None else frame
    labelled, _ = series.with_series(at_length, x=SEQ_LEN)
    length_note = f" at seq_len={load.format_value(seq_len)}" if seq_len is not None else ""
    fig, (ax,) = style.new_figure(1, f"Approximation error vs kernel time{length_note}")
    ok = labelled[(labelled[STATUS] == "ok") & labelled[x].notna() & labelled[y].notna()]
    if ok.empty:
        style.message(ax, "no kernel time with an approximation error in these results")
        style.label_axes(
            ax, "", "forward+backward kernel time (ms)", "relative error", log=(False, False)
        )
        return style.finish(fig)
    styles = style.series_styles(labelled)
    handles, labels = [], []
    for attention in dict.fromkeys(ok[ATTENTION]):
        rows = ok[ok[ATTENTION] == attention]
        knobs = _knobs(rows, attention)
        if not knobs:  # one point per configuration
            for name, point in rows.groupby("series", sort=False)[[x, y]].mean().iterrows():
                look = styles[name]
                (handle,) = ax.plot(
                    point[x], point[y], look["marker"], color=look["color"], label=name
                )
                handles.append(handle)
            continue
        knob = knobs[0]
        others = [*knobs[1:], *series.varying(rows, series.context_columns(rows))]
        keys = [rows[c].map(load.format_value) for c in others]
        lines = rows.groupby(keys, sort=False) if keys else [((), rows)]
        for i, (_, line) in enumerate(lines):
            points = line.groupby(knob)[[x, y]].mean()
            points = points.loc[sorted(points.index, key=_knob_sort_key)]
            color = style.shade(style.variant_color(attention), i)
            text = " ".join(
                [attention]
                + [f"{c.rsplit('.', 1)[-1]}={load.format_value(line[c].iloc[0])}" for c in others]
            )
            (handle,) = ax.plot(
                points[x],
                points[y],
                marker=style.MARKERS[i % len(style.MARKERS)],
                color=color,
                markersize=5,
                linewidth=1.2,
                label=f"{text} (along {knob.rsplit('.', 1)[-1]})",
            )
            handles.append(handle)
            for value, point in points.iterrows():
                label = ax.annotate(
                    load.format_value(value),
                    (point[x], point[y]),
                    fontsize=7,
                    color=color,
                    xytext=(4, 3),
                    textcoords="offset points",
                )
                labels.append((label, style.AROUND_POINT))
    style.legend_below(ax, handles)
    style.label_axes(
        ax, "", "forward+backward kernel time (ms)", "relative error", log=(True, False)
    )
    ax.margins(0.12)
    style.finish(fig)
    if style.place_labels(ax, labels):
        ax.set_title("(knob values left out where they would overlap)", fontsize=8)
        style.finish(fig)
    return fig


def _knobs(frame: pd.DataFrame, attention: str) -> list[str]:
    """The options of `attention` that vary in `frame`: its knobs first (the first is the one
    drawn along x), then any other, so a new variant's options are found without a list."""
    rows = frame[frame[ATTENTION] == attention]
    options = [c for c in rows.columns if c.startswith("attention.") and c != "attention.name"]
    swept = series.varying(rows, options)
    preferred = [k for k in series.knobs().get(attention, ()) if k in swept]
    return preferred + [k for k in swept if k not in preferred]


def _knob_sort_key(value) -> tuple:
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _swap_by_knob(group: pd.DataFrame, knob: str, order) -> dict[str, str]:
    """The kernel swap's Δ bits/byte at each knob value in `order`, when measured."""
    swap = SWAP_DELTA_BITS_PER_BYTE
    if swap not in group or group[swap].isna().all():
        return {}
    deltas = group.groupby(knob)[swap].mean().reindex(order)
    return {"swap Δ bits/byte": " → ".join(f"{d:.3g}" for d in deltas)}


# The knob table's verdicts: a step may rise this much (noise) and still count as falling, and
# an error that moves less than KNOB_FLAT from the coarsest setting to the finest is flat.
KNOB_STEP = 0.02
KNOB_FLAT = 0.05


def _knob_verdict(finer: pd.Series) -> str:
    """ "yes", "flat" or "NO" for errors ordered from the coarsest setting to the finest."""
    steps = finer.diff().dropna() / finer.shift().dropna()
    change = finer.iloc[-1] / finer.iloc[0] - 1
    if abs(change) < KNOB_FLAT and (steps.abs() < KNOB_FLAT).all():
        return "flat"
    return "yes" if (steps <= KNOB_STEP).all() and change <= -KNOB_FLAT else "NO"


def error_by_knob(frame: pd.DataFrame) -> Table | None:
    """Whether each variant's error on trained activations falls as its knob gets finer.

    One row per variant and setting of its other knobs whose first knob (`series.knobs()`) was
    swept: the error at each knob value, at the longest length measured, and whether it falls
    as the knob grows (as it shrinks for `series.smaller_is_finer()`): `_knob_verdict`.
    """
    rows = []
    finer_small = series.smaller_is_finer()
    for attention, (knob, *others) in series.knobs().items():
        if knob not in frame or APPROX_REL_ERROR not in frame:
            continue
        mine = frame[
            (frame[ATTENTION] == attention)
            & (frame[STATUS] == "ok")
            & frame[APPROX_REL_ERROR].notna()
            & frame[knob].notna()
        ]
        if mine.empty:
            continue
        mine = mine[mine[SEQ_LEN] == mine[SEQ_LEN].max()]
        others = [o for o in others if o in mine and mine[o].notna().any()]
        groups = mine.groupby(others, dropna=False) if others else [((), mine)]
        for setting, group in groups:
            errors = group.groupby(knob)[APPROX_REL_ERROR].mean()
            if len(errors) < 2:
                continue
            finer = errors.sort_index(ascending=knob not in finer_small)
            falls = _knob_verdict(finer)
            setting = setting if isinstance(setting, tuple) else (setting,)
            rows.append(
                {
                    "variant": attention,
                    "other knobs": ", ".join(
                        f"{o.split('.', 1)[1]}={load.format_value(v)}"
                        for o, v in zip(others, setting, strict=True)
                    )
                    or "—",
                    SEQ_LEN: format_length(mine[SEQ_LEN].iloc[0]),
                    "finer →": " → ".join(
                        f"{knob.split('.', 1)[1]}={load.format_value(k)}: {e:.3g}"
                        for k, e in finer.items()
                    ),
                    "falls": falls,
                    **_swap_by_knob(group, knob, finer.index),
                }
            )
    if not rows:
        return None
    note = (
        "Relative error on trained activations (approx_rel_error) at each knob value, ordered "
        "from the coarsest approximation to the finest; mean over seeds; 'swap': the held-out "
        "bits/byte change when the kernel replaces exact attention in the reference. 'yes': it "
        f"never rises by more than {KNOB_STEP:.0%} a step and ends at least {KNOB_FLAT:.0%} "
        f"lower; 'flat': it moves less than {KNOB_FLAT:.0%} from the coarsest to the finest; "
        "'NO': it does not fall as the approximation gets finer on these inputs "
        "(docs/quality/approximation.md, 'Knobs', says why where we measured it)."
    )
    return Table("Approximation error against each variant's knob", pd.DataFrame(rows), note)


SECTION = Section(
    "Approximation error",
    tables=(TableSpec(error_by_knob),),
    figures={
        "error_vs_seq_len": FigureSpec(
            error_vs_seq_len,
            "Relative approximation error against exact attention vs sequence length, on the "
            "trained reference's q, k, v (only within its trained length), and beside it the "
            "kernel swap: Δ bits/byte on held-out text when the kernel replaces exact attention "
            "in the reference.",
        ),
        "error_vs_knob": FigureSpec(
            error_vs_knob, "Approximation error against each variant's knob."
        ),
        "error_vs_time": FigureSpec(
            error_vs_time,
            "What accuracy costs: approximation error against the kernel's forward+backward "
            "time at one length; a variant's points are joined along its first knob, each "
            "labelled with the knob's value.",
        ),
    },
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.approximation_error SWEEP_DIR...`: the knob table (whether each
    variant's error on trained activations falls as its knob gets finer), as Markdown."""
    table_command.print_tables(
        "python -m analysis.approximation_error",
        main.__doc__,
        [error_by_knob],
        "no approximation error over a swept knob (the knobs preset)",
        argv,
    )


if __name__ == "__main__":
    main()
