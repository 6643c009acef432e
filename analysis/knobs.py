"""report.md's knob table: whether each variant's approximation error on trained activations
falls as its knob gets finer (`error_by_knob`). The approximation-error figures:
`analysis.figures.approximation_error`; the knobs themselves: each variant's `knobs`.
"""

from __future__ import annotations

import pandas as pd

from analysis import series
from analysis.column_names import (
    APPROX_REL_ERROR,
    ATTENTION,
    SEQ_LEN,
    STATUS,
    SWAP_DELTA_BITS_PER_BYTE,
)
from analysis.load import format_value
from analysis.markdown_table import Table, format_length


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
                        f"{o.split('.', 1)[1]}={format_value(v)}"
                        for o, v in zip(others, setting, strict=True)
                    )
                    or "—",
                    SEQ_LEN: format_length(mine[SEQ_LEN].iloc[0]),
                    "finer →": " → ".join(
                        f"{knob.split('.', 1)[1]}={format_value(k)}: {e:.3g}"
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
