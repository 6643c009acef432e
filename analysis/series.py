"""Which records make one curve, and what is drawn for it: mean and spread, or a failure.

A series is a `variant` plus whichever context columns differ within the frame: every resolved
configuration key (block, depth, causal, threads, train.steps, ...; `context_columns`), so only
records of identical configurations share a series. Columns that are the same everywhere are
left out of the label. What may still differ between a series' records at one x is the seed,
the sweep, the budget and how precisely it was measured (`measure.*`): that is spread, drawn as
the mean with a band from the minimum to the maximum.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from analysis import tuning
from analysis.context import context_columns
from analysis.load import format_value
from experiments.records.store import short_names

REFERENCE = "full"  # exact attention: what crossovers are measured against
FUSED = "sdpa"  # its fused kernel (O(L) memory on every device): the default baseline
# The same fused kernel with one SDPA backend pinned (`attention.impl=sdpa_<backend>`): it
# stands in for FUSED where plain `sdpa` was not measured. Not `sdpa_math`: SDPA's math backend
# holds the L×L scores, as QUADRATIC does.
FUSED_PINNED = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
QUADRATIC = "math"  # its textbook form, an L×L score matrix per head: the O(L²) baseline


def knobs() -> dict[str, tuple[str, ...]]:
    """Each registered variant that has knobs (`Attention.knobs`) -> them as record columns
    (`attention.<option>`): error is drawn against the first, and should fall as it grows,
    except for `smaller_is_finer` ones."""
    import variants  # the registry: torch, which only the knob tables and figures need

    specs = {name: variants.attention_spec(name) for name in variants.attention_names()}
    return {n: tuple(f"attention.{k}" for k in s.knobs) for n, s in specs.items() if s.knobs}


def smaller_is_finer() -> tuple[str, ...]:
    """The knob columns (`attention.<option>`) whose approximation is finer when smaller."""
    import variants

    specs = [variants.attention_spec(name) for name in variants.attention_names()]
    return tuple(dict.fromkeys(f"attention.{k}" for s in specs for k in s.smaller_is_finer))


# Tasks whose loss carries no quality signal (uniform tokens: every model sits at ln V).
NO_QUALITY_TASKS = ("random_lm",)
# Tasks only their own table reads (analysis.suites): MAD's kinds differ in length, vocabulary
# and what is scored, so their lengths are no length axis and their scores no one series.
SUITE_TASKS = ("mad",)


def trained_quality(
    frame: pd.DataFrame, metric: str = "eval_accuracy", *, suites: bool = False
) -> pd.DataFrame:
    """The records that measured a trained quality `metric`: status ok, a value, a task with a
    quality signal (never random tokens) and, unless `suites`, none of `SUITE_TASKS`; of a
    learning-rate grid, each variant's chosen rate's (`tuning.choose_learning_rates`:
    `lr_grid`, `lr_chosen` columns)."""
    if metric not in frame or "task" not in frame:
        return frame.iloc[0:0]
    left_out = NO_QUALITY_TASKS if suites else (*NO_QUALITY_TASKS, *SUITE_TASKS)
    quality = frame[~frame["task"].isin(left_out)]
    # A learning-rate grid: each variant's chosen rate, from every job of the grid (those that
    # did not end ok included: they score 0), on the validation split (analysis/tuning.py).
    quality = tuning.choose_learning_rates(quality, context_columns(quality))
    return quality[(quality["status"] == "ok") & quality[metric].notna()]


def varying(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The `columns` of `frame` that take more than one value.

    Missing values do not count: a skipped job records no `device`, which is not a second device.
    """
    return [c for c in columns if c in frame and frame[c].dropna().map(format_value).nunique() > 1]


def with_series(
    frame: pd.DataFrame, *, x: str | None = None, context: Sequence[str] | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """`frame` with a `series` label column, and the columns that define a series.

    The series columns are `variant` and the context columns (default `context_columns`;
    except the x-axis `x`) that vary in the frame, leaving out those that move with x alone (a
    curriculum's batch size, which keeps the tokens per step as seq_len grows). A label names
    the variant, then `name=value` for those of them that vary among that variant's rows, e.g.
    "full block=reversible" (so "lsh" when only exact attention was swept over blocks). When
    some variants ran causal and others not, the bidirectional ones say so:
    "linformer (bidirectional)".
    """
    context = context_columns(frame) if context is None else context
    candidates = varying(frame, [c for c in context if c != x])
    keys = ["variant", *(c for c in candidates if not _moves_with(frame, c, x))]
    labelled = frame.copy()
    labelled["series"] = variant_labels(frame, keys[1:], bidirectional="causal" in keys)
    return labelled, keys


def variant_labels(frame: pd.DataFrame, keys: Sequence[str], *, bidirectional: bool = False):
    """A label per row of `frame` (a Series on its index): the variant, then `name=value` for
    each of `keys` that varies among that variant's rows (a key that tells other variants apart,
    as `shared_qk` does LSH, is not shown on the rest). `bidirectional`: when causal varies in
    the frame but not among a variant's rows, its bidirectional rows say so instead."""
    labels = pd.Series(index=frame.index, dtype=object)
    for _, rows in frame.groupby("variant", sort=False):
        shown = ["variant", *varying(rows, keys)]
        say_direction = bidirectional and "causal" not in shown
        labels[rows.index] = [
            label(row, shown) + (" (bidirectional)" if say_direction and not row["causal"] else "")
            for _, row in rows.iterrows()
        ]
    return labels


def _moves_with(frame: pd.DataFrame, column: str, x: str | None) -> bool:
    """True if `column` takes one value at each x: it is part of the x axis, not a series."""
    if x is None or x not in frame:
        return False
    known = frame[frame[column].notna() & frame[x].notna()]
    per_x = known.groupby(x)[column].agg(lambda v: v.map(format_value).nunique())
    return len(per_x) > 1 and bool((per_x <= 1).all())


def key_values(labelled: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """One row per series (indexed by its label): the attention, then a column per key that
    varies in `labelled` (each varying `attention.*` option, then `keys[1:]`), named after its
    last dot; blank where a key does not apply (another variant's option)."""
    options = [
        c
        for c in labelled.columns
        if c.startswith("attention.") and c != "attention.name" and c not in keys
    ]
    columns = ["attention", *varying(labelled, options), *keys[1:]]
    columns = [c for c in dict.fromkeys(columns) if c in labelled]
    first = labelled.drop_duplicates("series").set_index("series")[columns]
    shown = first.map(lambda v: "" if v is None or (isinstance(v, float) and v != v) else v)
    shown = shown.map(lambda v: format_value(v) if v != "" else v)
    return shown.rename(columns={**short_names(columns), "attention": "variant"})


def label(row: pd.Series, keys: Sequence[str]) -> str:
    """The first key's value, then `name=value` for the others (name after its last dot)."""
    parts = [str(row[keys[0]])]
    parts += [f"{key.rsplit('.', 1)[-1]}={format_value(row[key])}" for key in keys[1:]]
    return " ".join(parts)


def series_order(frame: pd.DataFrame) -> list[str]:
    """Series labels with exact attention first, then in the frame's (sorted) order."""
    labels = list(dict.fromkeys(frame["series"]))
    return sorted(labels, key=lambda s: (not s.startswith(REFERENCE), labels.index(s)))


def mean_spread(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per series and x, over status-ok records with a value: mean, min, max and count of `y`."""
    ok = frame[(frame["status"] == "ok") & frame[y].notna() & frame[x].notna()]
    if ok.empty:
        return pd.DataFrame(columns=["series", x, "mean", "lo", "hi", "n"])
    grouped = ok.groupby(["series", x], sort=True)[y]
    stats = grouped.agg(["mean", "min", "max", "count"]).reset_index()
    return stats.rename(columns={"min": "lo", "max": "hi", "count": "n"})


def failures(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per series, x and non-ok status, how many records ended so (oom, timeout, skipped, ...)."""
    failed = frame[(frame["status"] != "ok") & frame[x].notna()]
    if failed.empty:
        return pd.DataFrame(columns=["series", x, "status", "n"])
    return failed.groupby(["series", x, "status"]).size().rename("n").reset_index()


def reference_of(frame: pd.DataFrame, keys: Sequence[str], impl: str = FUSED) -> dict[str, str]:
    """Each series' reference series: exact attention with the same context values.

    When exact attention was measured with several `impl`s, the fused SDPA one is the
    reference by default (a naive baseline would flatter every variant); `impl=QUADRATIC`
    asks for the O(L²) one instead, and gives no references when it was not measured.
    Series without a reference are left out.
    """
    exact = frame[frame["attention"] == REFERENCE]
    impls = exact["attention.impl"] if "attention.impl" in exact else None
    if impl != FUSED and (impls is None or not (impls == impl).any()):
        return {}
    chosen = None if impls is None else impls == impl
    if chosen is not None and impl == FUSED and not chosen.any():
        chosen = impls.isin(FUSED_PINNED)  # a pinned fused backend for PyTorch's own choice
    if chosen is not None and chosen.any():
        exact = exact[chosen]
    # Shared QK is what a variant requires (LSH), not a setting it is compared under: exact
    # attention runs without it, and the kernel alone is timed on the same q, k, v either way.
    context = [k for k in keys[1:] if k != "shared_qk"]
    by_context = {_context_values(row, context): row["series"] for _, row in exact.iterrows()}
    references = {}
    for _, row in frame.drop_duplicates("series").iterrows():
        match = by_context.get(_context_values(row, context))
        if match is not None and match != row["series"]:
            references[row["series"]] = match
    return references


def _context_values(row: pd.Series, columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(format_value(row[c]) for c in columns)
