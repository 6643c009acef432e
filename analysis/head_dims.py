"""report.md's section (`SECTION`) for a sweep over head dims (`+experiment=heads`), two tables:

- `crossovers_by_head_dim`: per variant, its crossover L* against exact attention at each head
  dim, plain multi-head (`n_kv_heads` = `n_heads`), and which way it moves from the smallest
  head dim to the largest. The crossovers are `scaling_fits.scaling_fits`'s, the report's own
  ("L* vs SDPA" of "Speed-up over exact attention": forward+backward, from the in-job speed-ups
  where the records have them, else against exact attention's jobs at the same head dim).
- `grouped_kv_heads`: what grouped KV heads change, per variant, head count and length: kernel
  forward+backward time and kernel peak memory at each `n_kv_heads` below `n_heads`, as a ratio
  to the same kernel at `n_kv_heads` = `n_heads`.

Both are None unless the records hold more than one head dim, so the report of any other sweep
is unchanged. Alone: `python -m analysis.head_dims PATH...` prints both (docs/heads.md's).
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import fit, scaling_fits, series, table_command
from analysis.column_names import (
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    HEAD_DIM,
    N_HEADS,
    N_KV_HEADS,
    SEQ_LEN,
    STATUS,
)
from analysis.load import format_value
from analysis.markdown_table import Table
from analysis.section import Section, TableSpec

# The series keys that are the heads themselves: a row of these tables is a variant (and any
# other key that varies), its columns the head dims (and KV heads).
HEAD_KEYS = (N_HEADS, HEAD_DIM, N_KV_HEADS)
NOT_RUN = "not run"


def has_head_dims(frame: pd.DataFrame) -> bool:
    """Whether the records hold more than one head dim (a heads sweep)."""
    return HEAD_DIM in frame and frame[HEAD_DIM].dropna().nunique() > 1


def crossovers_by_head_dim(frame: pd.DataFrame) -> Table | None:
    """Per variant: L* against exact attention (forward+backward) at each head dim, at
    n_kv_heads = n_heads, and its direction from the smallest head dim to the largest. None
    unless the records have more than one head dim, or without any efficient variant."""
    if not has_head_dims(frame):
        return None
    plain = frame[frame[N_KV_HEADS] == frame[N_HEADS]]
    if plain.empty:
        return None
    labelled, keys = series.with_series(plain, x=SEQ_LEN)
    fits = scaling_fits.scaling_fits(labelled, keys, ATTN_FWD_BWD_MS)
    others = [k for k in keys[1:] if k not in HEAD_KEYS]
    head_dims = sorted(int(d) for d in labelled[HEAD_DIM].dropna().unique())
    rows = []
    for row_label, mine in _rows(labelled, others):
        names = set(mine["series"])
        if (mine[ATTENTION] == series.REFERENCE).all() and all(
            fits[n].crossover is None for n in names if n in fits
        ):
            continue  # exact attention in the form the crossovers are against
        row = {"variant": row_label}
        crossovers: dict[int, fit.Crossover] = {}
        for d in head_dims:
            at = mine[mine[HEAD_DIM] == d]
            if at.empty:
                row[f"L* @ head dim {d}"] = NOT_RUN
                continue
            name = at["series"].iloc[0]
            crossover = fits[name].crossover if name in fits else None
            if not (at[STATUS] == "ok").any():
                row[f"L* @ head dim {d}"] = _statuses(at)
            elif crossover is None:
                row[f"L* @ head dim {d}"] = "no exact attention"
            else:
                row[f"L* @ head dim {d}"] = str(crossover)
                if crossover.kind != fit.NO_OVERLAP:
                    crossovers[d] = crossover
        row["moves"] = direction(crossovers)
        rows.append(row)
    if not rows:
        return None
    note = (
        "L*: the length above which the variant's kernel (forward+backward) is faster than "
        "exact attention (SDPA) of the same head dim, plain multi-head (n_kv_heads = n_heads); "
        'the same crossover as "Speed-up over exact attention" (`scaling_fits`), '
        "log-interpolated between measured lengths, so with two lengths only: ≤x faster at "
        "both, >x still slower at the longest. moves: from the smallest head dim with an L* to "
        "the largest; up: the variant needs longer sequences to pay off; stays: the same L* or "
        "the same bound at both; unresolved: the measured lengths do not order the two (e.g. "
        "≤4,096 and 3,000); (not monotone): a head dim between moves the other way."
    )
    return Table("Crossover against exact attention by head dim", pd.DataFrame(rows), note)


def grouped_kv_heads(frame: pd.DataFrame) -> Table | None:
    """Per variant and head count (head dim ascending): kernel forward+backward time and
    kernel peak memory at each n_kv_heads below n_heads, over the same at n_kv_heads = n_heads,
    at each length (mean over repeats). None unless the records have more than one head dim
    and some grouped KV heads."""
    if not has_head_dims(frame) or not (frame[N_KV_HEADS] < frame[N_HEADS]).any():
        return None
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    others = [k for k in keys[1:] if k not in HEAD_KEYS]
    grouped = sorted(
        int(kv) for kv in labelled.loc[labelled[N_KV_HEADS] < labelled[N_HEADS], N_KV_HEADS]
    )
    kv_values = sorted(set(grouped))
    lengths = sorted(labelled[SEQ_LEN].dropna().unique())
    rows = []
    for row_label, mine in _rows(labelled, others):
        for heads in sorted((int(h) for h in mine[N_HEADS].dropna().unique()), reverse=True):
            at_heads = mine[mine[N_HEADS] == heads]
            row = {
                "variant": row_label,
                "heads": heads,
                "head dim": format_value(at_heads[HEAD_DIM].iloc[0]),
            }
            for length in lengths:
                at_length = at_heads[at_heads[SEQ_LEN] == length]
                base = at_length[at_length[N_KV_HEADS] == heads]
                for kv in kv_values:
                    row[f"H_kv={kv} @ L={_length(length)}"] = _ratio_cell(
                        at_length[at_length[N_KV_HEADS] == kv], base, kv, heads
                    )
            rows.append(row)
    if not rows:
        return None
    note = (
        "Each cell: the kernel's forward+backward time / its peak memory (kernel alone) with "
        "H_kv key/value heads, over the same kernel with H_kv = H (heads; plain multi-head), "
        "same length and head dim, mean over repeats; below 1 grouped KV heads cost less. "
        "Time ratios are of kernels timed in separate jobs (a load change between them is not "
        "cancelled, as it is in the in-job speed-ups). = H: that H_kv is plain multi-head at "
        f"this head count; {NOT_RUN}: no record; skipped etc.: the jobs' status."
    )
    return Table("Grouped KV heads: cost against H_kv = H", pd.DataFrame(rows), note)


def direction(crossovers: dict[int, fit.Crossover]) -> str:
    """Which way L* moves from the smallest head dim to the largest of `crossovers` (head dim ->
    a crossover with a length), e.g. "up: 1,200 → 2,900 from head dim 32 to 128 (×2.4)"."""
    if len(crossovers) < 2:
        return "—"
    dims = sorted(crossovers)
    first, last = crossovers[dims[0]], crossovers[dims[-1]]
    way = _way(first, last)
    span = f"{_short(first)} → {_short(last)} from head dim {dims[0]} to {dims[-1]}"
    if way == "same":
        text = f"stays {_short(first)} from head dim {dims[0]} to {dims[-1]}"
    elif way == "unresolved":
        text = f"unresolved: {span}"
    else:
        text = f"{way}: {span}"
        if first.kind == last.kind == fit.CROSSED:
            text += f" (×{last.length / first.length:.2g})"
        steps = [
            _way(crossovers[a], crossovers[b]) for a, b in zip(dims[:-1], dims[1:], strict=True)
        ]
        if any(step in ("up", "down") and step != way for step in steps):
            text += " (not monotone)"
    if any(c.uncertain for c in (first, last)):
        text += " (uncertain)"
    return text


def _way(a: fit.Crossover, b: fit.Crossover) -> str:
    """ "up", "down", "same" (the same bound at both) or "unresolved" (the bounds overlap)."""
    (a_lo, a_hi), (b_lo, b_hi) = _bounds(a), _bounds(b)
    if (a.kind, a.length) == (b.kind, b.length) and a.kind != fit.CROSSED:
        return "same"
    if a.kind == b.kind == fit.CROSSED and a.length == b.length:
        return "same"
    if a_hi < b_lo or (a_hi <= b_lo and a.kind != b.kind):
        return "up"
    if b_hi < a_lo or (b_hi <= a_lo and a.kind != b.kind):
        return "down"
    return "unresolved"


def _bounds(crossover: fit.Crossover) -> tuple[float, float]:
    """The lengths L* may be, as (lowest, highest): exact when crossed, ≤ the shortest length
    when always faster (or exact attention failed there), > the longest when never."""
    if crossover.kind == fit.CROSSED:
        return crossover.length, crossover.length
    if crossover.kind == fit.NEVER:
        return crossover.length, math.inf
    return 0.0, crossover.length  # ALWAYS_FASTER, REFERENCE_FAILED


def _short(crossover: fit.Crossover) -> str:
    """The crossover's cell without "(uncertain)" (said once, at the end of the direction)."""
    return str(crossover).replace(" (uncertain)", "").lstrip("≈")


def _rows(labelled: pd.DataFrame, others: list[str]):
    """(row label, its records) per variant and each other varying key but the heads'."""
    labels = series.variant_labels(labelled, others)
    for row_label in dict.fromkeys(labels):
        yield row_label, labelled[labels == row_label]


def _statuses(rows: pd.DataFrame) -> str:
    return ", ".join(sorted(set(rows[STATUS].dropna()))) or NOT_RUN


def _ratio_cell(grouped: pd.DataFrame, base: pd.DataFrame, kv: int, heads: int) -> str:
    if kv == heads:
        return "= H"
    if kv > heads:
        return ""
    if grouped.empty:
        return NOT_RUN
    if not (grouped[STATUS] == "ok").any():
        return _statuses(grouped)
    if not (base[STATUS] == "ok").any():
        return f"no H_kv={heads} ({_statuses(base)})"
    ratios = [
        _mean_ratio(grouped, base, metric) for metric in (ATTN_FWD_BWD_MS, ATTN_FWD_BWD_PEAK_BYTES)
    ]
    return " / ".join("—" if r is None else f"{r:.2f}" for r in ratios)


def _mean_ratio(grouped: pd.DataFrame, base: pd.DataFrame, metric: str) -> float | None:
    def mean(rows: pd.DataFrame) -> float:
        return rows.loc[rows[STATUS] == "ok", metric].dropna().mean()

    mine, theirs = mean(grouped), mean(base)
    if pd.isna(mine) or pd.isna(theirs) or theirs <= 0:
        return None
    return float(mine / theirs)


def _length(value) -> str:
    return f"{float(value):,.0f}"


SECTION = Section(
    "Head dims",
    tables=(TableSpec(crossovers_by_head_dim), TableSpec(grouped_kv_heads)),
)


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.head_dims SWEEP_DIR...`: the crossover by head dim and the grouped KV
    heads' ratios, as Markdown."""
    table_command.print_tables(
        "python -m analysis.head_dims",
        main.__doc__,
        [crossovers_by_head_dim, grouped_kv_heads],
        "no records over more than one head dim (the heads preset)",
        argv,
    )


if __name__ == "__main__":
    main()
