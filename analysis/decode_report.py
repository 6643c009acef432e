"""What the report says about decoding (records of `measure.decode`,
experiments/measurement/decode_cost.py): a figure of per-token time and cache memory against
the context, a table of both per variant and context (the report's section: `SECTION`), and one
headline clause per variant at the longest context.

A series is a variant plus the context columns that differ (batch size, ...), as in every
other figure (`series.with_series`); the x axis is the job's seq_len, the context the tokens
are decoded onto.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from analysis import series, table_command
from analysis.column_names import (
    ATTENTION,
    BATCH_SIZE,
    DECODE_BANDWIDTH_FRACTION,
    DECODE_MS_PER_TOKEN,
    DECODE_STATE_BYTES,
    LAYERS,
    SEQ_LEN,
    STATUS,
)
from analysis.figures import style
from analysis.markdown_table import Table
from analysis.section import DECODE, FigureSpec, Section, TableSpec
from experiments.records.record import MIB

SCOPE = "measure.decode_scope"  # kernel (older records: no such key) | model
TIME = DECODE_MS_PER_TOKEN
CACHE = DECODE_STATE_BYTES
FRACTION = DECODE_BANDWIDTH_FRACTION


def records(frame: pd.DataFrame) -> pd.DataFrame:
    """The records of decoding jobs (`measure.decode` true, or a decode measurement)."""
    if "measure.decode" in frame:
        return frame[frame["measure.decode"].astype("boolean").fillna(False).astype(bool)]
    if TIME in frame:
        return frame[frame[TIME].notna()]
    return frame.iloc[0:0]


def has_decode(frame: pd.DataFrame) -> bool:
    """Whether any record measured decoding."""
    rows = records(frame)
    return TIME in rows and bool(rows[TIME].notna().any())


def decode_vs_context(frame: pd.DataFrame) -> Figure:
    """Two panels, log-log against the context: ms per decoded token, and the cache (MiB)."""
    rows = records(frame)
    rows = rows.assign(cache_mib=rows[CACHE] / MIB if CACHE in rows else float("nan"))
    labelled, _ = series.with_series(rows, x=SEQ_LEN)
    fig, axes = style.new_figure(2, "Decoding: time per token and cache memory vs context")
    panels = (
        (TIME, "time per decoded token", "ms per token"),
        ("cache_mib", "cache after the prefill", "cache (MiB)"),
    )
    for ax, (column, title, unit) in zip(axes, panels, strict=True):
        if column not in labelled:
            labelled = labelled.assign(**{column: float("nan")})
        xs = style.draw_series(ax, labelled, SEQ_LEN, column, min_points=2)
        style.label_axes(ax, title, "context (tokens)", unit, log=(True, True), xs=xs)
    return style.finish(fig)


def decode_table(frame: pd.DataFrame) -> Table | None:
    """Per series and context: ms per token and cache MiB; the exact cache's read rate as a
    fraction of the copy bandwidth at the longest context."""
    rows = records(frame)
    if rows.empty or TIME not in rows:
        return None
    labelled, keys = series.with_series(rows, x=SEQ_LEN)
    times = series.mean_spread(labelled, SEQ_LEN, TIME)
    if times.empty:
        return None
    caches = series.mean_spread(labelled, SEQ_LEN, CACHE) if CACHE in labelled else None
    fractions = series.mean_spread(labelled, SEQ_LEN, FRACTION) if FRACTION in labelled else None
    lengths = sorted(times[SEQ_LEN].unique())
    table_rows = []
    for name in series.series_order(labelled):
        row = {"series": name}
        for length in lengths:
            row[f"L={length:,.0f}"] = _cell(times, caches, name, length)
        if fractions is not None:
            row["bandwidth fraction @ longest"] = _at_longest(fractions, name, ".2f")
        table_rows.append(row)
    table = pd.DataFrame(table_rows)
    described = series.key_values(labelled, keys).loc[table["series"]].reset_index(drop=True)
    table = pd.concat([described, table.drop(columns="series")], axis=1)
    note = (
        f"Each cell: ms per decoded token (median of the timed steps, {scope_text(frame)}) · "
        "the decoder's state (decode_state_bytes: its caches' MiB after prefilling L tokens). "
        "Bandwidth fraction: state bytes read per token "
        "over the time, against a copy of a cache-sized tensor timed beside each step (bytes "
        "read + written); meaningful only where the cache exceeds the CPU's caches (exact "
        "attention at long contexts)."
    )
    return Table("Decoding", table, note)


def per_context(frame: pd.DataFrame) -> tuple[pd.DataFrame, float | None]:
    """Ms per token (`TIME`) and cache bytes (`CACHE`) per `attention` and `seq_len` (the
    context), mean over the ok records at the smallest batch decoded, exact attention first;
    and that batch (None when no record says). Empty without decode records. A hybrid stack's
    records (`model.layers`) are its own rows, named by their `layers` ("3×deltanet+full")."""
    rows = records(frame)
    if rows.empty or TIME not in rows or not rows[TIME].notna().any():
        return pd.DataFrame(columns=[ATTENTION, SEQ_LEN, TIME, CACHE]), None
    ok = rows[(rows[STATUS] == "ok") & rows[TIME].notna()]
    if LAYERS in ok:  # a stack's name: its attention, unless its layers mix variants
        ok = ok.assign(**{ATTENTION: ok[LAYERS].where(ok[LAYERS].notna(), ok[ATTENTION])})
    if CACHE not in ok:
        ok = ok.assign(**{CACHE: float("nan")})
    batch = ok[BATCH_SIZE].min() if BATCH_SIZE in ok else None
    if batch is not None:
        ok = ok[ok[BATCH_SIZE] == batch]
    means = ok.groupby([ATTENTION, SEQ_LEN], sort=False)[[TIME, CACHE]].mean().reset_index()
    order = list(dict.fromkeys(ok[ATTENTION]))
    order.sort(key=lambda n: n != series.REFERENCE)
    means["_order"] = means[ATTENTION].map(order.index)
    means = means.sort_values(["_order", SEQ_LEN]).drop(columns="_order")
    return means.reset_index(drop=True), batch


def at_longest(means: pd.DataFrame) -> pd.DataFrame:
    """The rows of `per_context(...)[0]` at each variant's longest context."""
    return means.groupby(ATTENTION, sort=False).tail(1).reset_index(drop=True)


def headline(frame: pd.DataFrame) -> list[str]:
    """Markdown lines: one clause per variant at the longest context it decoded (smallest
    batch), against exact attention's cache there; [] without decode records."""
    means, batch = per_context(frame)
    if means.empty:
        return []
    exact = means[means[ATTENTION] == series.REFERENCE].set_index(SEQ_LEN)[CACHE]
    clauses = []
    for _, mine in at_longest(means).iterrows():
        name, length = mine[ATTENTION], mine[SEQ_LEN]
        text = (
            f"**{name}** at {context_text(length)}: {mine[TIME]:.3g} ms/token, cache "
            f"{cache_text(mine[CACHE])}"
        )
        if name != series.REFERENCE and length in exact.index:
            text += f" vs exact {cache_text(exact[length])}"
        clauses.append(text)
    batch_text = f" (batch {batch:.0f}, {scope_text(frame)})" if batch is not None else ""
    return [
        "## Decoding",
        "",
        f"Per token at the longest context each variant decoded{batch_text}: "
        + "; ".join(clauses)
        + ".",
        "",
    ]


def scope_text(frame: pd.DataFrame) -> str:
    """What the decode records decoded with (`measure.decode_scope`; older records: the kernel
    alone): "the kernel alone", "the whole model, every layer's cache", or both named."""
    rows = records(frame)
    scopes = set(rows.get(SCOPE, pd.Series(dtype=object)).fillna("kernel").map(str)) or {"kernel"}
    texts = {"kernel": "the kernel alone", "model": "the whole model, every layer's cache"}
    if len(scopes) == 1:
        return texts.get(next(iter(scopes)), next(iter(scopes)))
    return "the kernel alone or the whole model, as measure.decode_scope says"


def _cell(times: pd.DataFrame, caches: pd.DataFrame | None, name: str, length) -> str:
    time = times[(times["series"] == name) & (times[SEQ_LEN] == length)]
    if time.empty:
        return "—"
    text = f"{time['mean'].iloc[0]:.3g} ms"
    if caches is not None:
        cache = caches[(caches["series"] == name) & (caches[SEQ_LEN] == length)]
        if len(cache):
            text += f" · {cache_text(cache['mean'].iloc[0])}"
    return text


def _at_longest(stats: pd.DataFrame, name: str, spec: str) -> str:
    mine = stats[stats["series"] == name]
    if mine.empty:
        return "—"
    return format(mine.loc[mine[SEQ_LEN].idxmax(), "mean"], spec)


def cache_text(value: float) -> str:
    """ "128 MiB", "65 KiB": a size in bytes, as the tables and headlines print it."""
    mib = value / MIB
    return f"{mib:.3g} MiB" if mib >= 1 else f"{value / 2**10:.3g} KiB"


def context_text(length: float) -> str:
    """ "4K" for a multiple of 1,024 tokens, else "1,000"."""
    return f"{length / 1024:.0f}K" if length >= 1024 and length % 1024 == 0 else f"{length:,.0f}"


SECTION = Section(
    "Decoding",
    tables=(TableSpec(decode_table, DECODE),),
    figures={
        "decode_vs_context": FigureSpec(
            decode_vs_context,
            "Decoding: the kernel's time per token appended to a cache of L tokens, and the "
            "cache's size after the prefill, against the context L (log-log; measure.decode).",
            when=lambda frame: (
                None if has_decode(frame) else "no decode measurements (measure.decode=true)"
            ),
            reads=DECODE,
        ),
    },
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.decode_report SWEEP_DIR...`: the Decoding table, as Markdown."""
    table_command.print_tables(
        "python -m analysis.decode_report",
        main.__doc__,
        [decode_table],
        "no decode measurements (measure.decode=true) in these records",
        argv,
    )


if __name__ == "__main__":
    main()
