"""Recall against decoding state: each variant's MQAR recall beside the bytes it decodes with.

Zoology and Based read every mixer's recall against its state: a KV cache grows with the
context, a d x d state (linear, DeltaNet, Gated DeltaNet, Mamba-2) is fixed, a window keeps w
positions. From capacity records that carry `decode_state_bytes` (`measure.decode_state`): a
point per variant configuration (knobs that vary, e.g. a window) and head dim, at each
variant's chosen rate; state = `decode_state_bytes` / `batch_size` (per sequence, at the
records' length and `measure.decode_scope`), recall = the mean over the pair counts (and seeds)
of the trained accuracy, and at the most pairs.

A point is on the Pareto frontier (`pareto_front`) when no other recalls at least as well with
at most as much state, strictly better in one; a variant that never learned (no evaluation at
90 %) is drawn hollow and kept off it: its accuracy is the budget's (docs/quality.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import capacity, hybrid, table_command, tuning
from analysis.column_names import ATTENTION, BATCH_SIZE, DECODE_STATE_BYTES, EVAL_ACCURACY
from analysis.decode_report import cache_text
from analysis.figures import style
from analysis.load import format_value
from analysis.markdown_table import Table
from analysis.section import FigureSpec, Section, TableSpec

STATE = "state_bytes"  # per sequence
RECALL = "recall"  # mean over the pair counts
AT_MOST = "recall_at_most"  # at the largest count
ON_FRONTIER = "on_frontier"


def pareto_front(state: pd.Series, recall: pd.Series) -> pd.Series:
    """Whether each point is on the Pareto frontier of (less `state`, more `recall`): no other
    point has state <= and recall >= with one of them strict. Equal points are both on it."""
    order = np.lexsort((-recall.to_numpy(), state.to_numpy()))  # by state, best recall first
    on = np.zeros(len(state), dtype=bool)
    best = -np.inf  # the best recall among points of strictly less state
    values_state, values_recall = state.to_numpy()[order], recall.to_numpy()[order]
    i = 0
    while i < len(order):  # one group of equal state at a time
        j = i
        while j < len(order) and values_state[j] == values_state[i]:
            j += 1
        top = values_recall[i]  # the group's best (sorted first)
        if top > best:
            on[order[i:j]] = values_recall[i:j] == top
            best = top
        i = j
    return pd.Series(on, index=state.index)


def frontier_points(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per point (a variant's configuration and head dim) of the capacity records that
    carry `decode_state_bytes`: `point` (its label), `attention`, `head_dim`, STATE, RECALL,
    AT_MOST, `most_pairs`, `learned`, `lr`, `seeds` and ON_FRONTIER; and the labels of the
    points whose records carry no state (not drawn). Empty without capacity records."""
    records = capacity.capacity_records(frame)
    if records.empty:
        return pd.DataFrame(), []
    records = records.assign(point=records["variant"].map(str))  # a stack's: its layers
    measured = records[DECODE_STATE_BYTES].notna() & records[BATCH_SIZE].notna()
    missing = sorted(records.loc[~measured, "point"].unique())
    rows = []
    for (point, head_dim), mine in records[measured].groupby(["point", "head_dim"], sort=False):
        per_seed = mine.groupby(["seed", capacity.PAIRS])[EVAL_ACCURACY].mean()
        most = mine[capacity.PAIRS].max()
        state = (mine[DECODE_STATE_BYTES] / mine[BATCH_SIZE]).max()
        rows.append(
            {
                "point": point,
                ATTENTION: mine[ATTENTION].iloc[0],
                "head_dim": int(head_dim),
                STATE: float(state),
                RECALL: float(per_seed.groupby("seed").mean().mean()),
                AT_MOST: float(per_seed.xs(most, level=capacity.PAIRS).mean()),
                "most_pairs": most,
                "learned": bool(mine["job_learned"].any()),
                "lr": tuning.lr_text(mine),
                "seeds": mine["seed"].nunique(),
            }
        )
    points = pd.DataFrame(rows)
    if points.empty:
        return points, missing
    points[ON_FRONTIER] = False
    learned = points["learned"]
    points.loc[learned, ON_FRONTIER] = pareto_front(
        points.loc[learned, STATE], points.loc[learned, RECALL]
    )
    points = points.sort_values([STATE, RECALL], ascending=[True, False], kind="stable")
    return points.reset_index(drop=True), [m for m in missing if m not in set(points["point"])]


def has_points(frame: pd.DataFrame) -> bool:
    return not frontier_points(frame)[0].empty


def frontier_table(frame: pd.DataFrame) -> Table | None:
    """Per point, by state: its state per sequence, recall (mean over the counts, and at the
    most pairs), learning rate, and whether it is on the frontier (else which frontier point
    dominates it); None without capacity records that carry a state."""
    points, missing = frontier_points(frame)
    if points.empty:
        return None
    most = format_value(points["most_pairs"].max())
    frontier = points[points[ON_FRONTIER]]
    rows = []
    for _, p in points.iterrows():
        rows.append(
            {
                "variant": p["point"],
                "head dim": p["head_dim"],
                "state / sequence": cache_text(p[STATE]),
                "recall, mean over the counts (%)": f"{p[RECALL] * 100:.1f}",
                f"recall at {most} pairs (%)": f"{p[AT_MOST] * 100:.1f}",
                "lr": p["lr"],
                "frontier": _frontier_cell(p, frontier),
            }
        )
    length = format_value(capacity.capacity_records(frame)["seq_len"].iloc[0])
    note = (
        "Recall against decoding state (Zoology, Based): state is decode_state_bytes per "
        f"sequence at {length} tokens ({_scope(frame)}); recall the trained accuracy on MQAR, the "
        "mean over the numbers of pairs (and seeds), beside it at the most pairs. Frontier: no "
        "other point recalls at least as well with at most as much state (and better in one); "
        "a variant that never reached 90 % is not learned and left off it. "
        + tuning.protocol_line(capacity.capacity_records(frame))
    )
    if missing:
        note += (
            f" Not shown, their records carry no decode_state_bytes (measure.decode_state): "
            f"{', '.join(missing)}."
        )
    return Table("Recall against decoding state", pd.DataFrame(rows), note)


def _frontier_cell(point: pd.Series, frontier: pd.DataFrame) -> str:
    if not point["learned"]:
        return "— (not learned)"
    if point[ON_FRONTIER]:
        return "yes"
    better = frontier[(frontier[STATE] <= point[STATE]) & (frontier[RECALL] >= point[RECALL])]
    first = better.sort_values(STATE).iloc[0] if len(better) else None
    return "no" if first is None else f"no: {first['point']} (head dim {first['head_dim']})"


def _scope(frame: pd.DataFrame) -> str:
    scopes = set(frame.get("measure.decode_scope", pd.Series(dtype=object)).dropna())
    if scopes == {"model"}:
        return "the whole model: every layer's cache"
    if scopes == {"kernel"}:
        return "one layer's kernel"
    return "the whole model or one kernel, as each record's measure.decode_scope says"


def recall_vs_state(frame: pd.DataFrame) -> Figure:
    """Recall (mean over the pair counts) against the decoding state per sequence (log 2), a
    point per variant configuration and head dim (marker per head dim; hollow: not learned), the
    Pareto frontier as a dashed staircase."""
    points, _ = frontier_points(frame)
    fig, (ax,) = style.new_figure(1, "Recall against decoding state (MQAR)")
    if points.empty:
        style.message(ax, "no capacity records with decode_state_bytes (measure.decode_state)")
        return style.finish(fig)
    head_dims = sorted(points["head_dim"].unique())
    configs: dict[str, list[str]] = {}  # per colour (a stack: its efficient layer's), its points
    for _, p in points.iterrows():
        mine = configs.setdefault(hybrid.efficient_layer(p[ATTENTION]), [])
        if p["point"] not in mine:
            mine.append(p["point"])
    handles = []
    for _, p in points.iterrows():
        family = hybrid.efficient_layer(p[ATTENTION])
        color = style.shade(style.variant_color(family), configs[family].index(p["point"]))
        marker = style.MARKERS[head_dims.index(p["head_dim"]) % len(style.MARKERS)]
        label = p["point"] + (f", head dim {p['head_dim']}" if len(head_dims) > 1 else "")
        if not p["learned"]:
            label += " (not learned)"
        handles.append(
            ax.scatter(
                [p[STATE]],
                [p[RECALL] * 100],
                s=40,
                marker=marker,
                facecolors=color if p["learned"] else "none",
                edgecolors=[color],
                linewidths=1.2,
                zorder=3,
                label=label,
            )
        )
    frontier = points[points[ON_FRONTIER]].sort_values(STATE)
    if len(frontier):
        xs = [*frontier[STATE], points[STATE].max() * 1.5]
        ys = [*frontier[RECALL] * 100, frontier[RECALL].iloc[-1] * 100]
        ax.step(xs, ys, where="post", color="grey", linestyle="--", linewidth=1, zorder=2)
        handles.append(Line2D([], [], color="grey", linestyle="--", label="Pareto frontier"))
    ax.set_xscale("log", base=2)
    ax.get_xaxis().set_major_formatter(lambda value, _position: cache_text(value))
    ax.set_xlabel("decoding state per sequence")
    ax.set_ylabel("recall, mean over the pair counts (%)")
    ax.set_ylim(-2, 102)
    style.legend_below(ax, handles, ncol=2 if len(handles) > 6 else 1)
    return style.finish(fig)


SECTION = Section(
    "Recall against decoding state",
    tables=(TableSpec(frontier_table),),
    figures={
        "recall_vs_state": FigureSpec(
            recall_vs_state,
            "Recall against decoding state (Zoology, Based): each variant's MQAR recall on the "
            "capacity preset (mean over the pair counts) against the bytes its decoder keeps "
            "per sequence at that length (decode_state_bytes); marker per head dim, hollow: "
            "not learned; dashed: the Pareto frontier.",
            when=lambda frame: (
                None
                if has_points(frame)
                else "no capacity records with decode_state_bytes (measure.decode_state)"
            ),
        ),
    },
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.frontier SWEEP_DIR...`: the recall-against-state table, as Markdown."""
    table_command.print_tables(
        "python -m analysis.frontier",
        main.__doc__,
        [frontier_table],
        "no capacity records with decode_state_bytes (measure.decode_state)",
        argv,
    )


if __name__ == "__main__":
    main()
