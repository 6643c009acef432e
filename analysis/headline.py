"""The first lines of a report: per variant, in words, what its measurements say.

Three answers per efficient variant, from the same functions the tables use, so they agree:
- speed: the length from which its kernel's forward+backward is faster than exact attention's
  fused kernel (SDPA), and than its O(L²) form (`impl=math`) where that was measured, from the
  speed-ups each job measured in alternating rounds (`analysis.scaling_fits`); "≈ L*
  (uncertain: timing spread)" where the rounds' spread around L* straddles 1;
- memory: its kernel's own forward+backward peak at the longest length it reached, as a factor
  against SDPA and the O(L²) form at that length (or where those stopped);
- quality: trained accuracy at the longest length where exact attention reached the task's
  ceiling, in points against exact attention's; a variant that never reached 90 % is "not
  learned in N steps (control x %)". From a capacity sweep, the variant's recall capacity per
  head dim instead (`analysis.capacity`).
A variant says only what was measured: a clause is left out when its records are missing.
"""

from __future__ import annotations

import pandas as pd

from analysis import accuracy, capacity, scaling_fits, series
from analysis.column_names import (
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    EVAL_ACCURACY,
    SEQ_LEN,
    TASK,
)
from analysis.fit import ALWAYS_FASTER, CROSSED, NEVER, REFERENCE_FAILED
from analysis.load import format_value
from analysis.trained_quality import CEILING
from experiments.records.record import MIB

TIME = ATTN_FWD_BWD_MS
MEMORY = ATTN_FWD_BWD_PEAK_BYTES
ACCURACY = EVAL_ACCURACY
UNCERTAIN = "uncertain: timing spread"


def headline(cost: pd.DataFrame, quality: pd.DataFrame | None = None) -> list[str]:
    """Markdown lines: a "Headline" section with one bullet per efficient variant, or [] when
    the records hold nothing to say. `cost`: the records of kernel time and memory over
    seq_len; `quality`: those of trained accuracy (default: `cost` itself)."""
    quality = cost if quality is None else quality
    labelled, keys = series.with_series(cost, x=SEQ_LEN)
    speed = {
        baseline: scaling_fits.scaling_fits(labelled, keys, TIME, baseline=baseline)
        for baseline in (series.FUSED, series.QUADRATIC)
    }
    references = {
        baseline: series.reference_of(labelled, keys, baseline)
        for baseline in (series.FUSED, series.QUADRATIC)
    }
    memory = series.mean_spread(labelled, SEQ_LEN, MEMORY) if MEMORY in labelled else None
    capacities = capacity.capacity_cells(quality)
    costs = {} if capacities else _accuracy_cost(quality)
    bullets = []
    for name in series.series_order(labelled):
        rows = labelled[labelled["series"] == name]
        if rows[ATTENTION].iloc[0] == series.REFERENCE:
            continue
        clauses = [
            _speed_clause(speed[series.FUSED].get(name), speed[series.QUADRATIC].get(name)),
            _memory_clause(memory, name, references),
            costs.get(str(rows[ATTENTION].iloc[0])),
        ]
        clauses = [c for c in clauses if c]
        if clauses:
            bullets.append(f"- **{name}**: " + "; ".join(clauses) + ".")
    bullets += [f"- **{name}**: {_capacity_clause(by_dim)}." for name, by_dim in capacities.items()]
    if not bullets:
        return []
    return [
        "## Headline",
        "",
        "Per efficient variant: where its attention kernel (forward+backward) overtakes exact "
        "attention, what the kernel alone holds in memory at the longest length, and what it "
        "costs in trained accuracy. The tables and figures below hold the details. (PyTorch's "
        "SDPA is itself a fused kernel whose memory grows as O(L), so a variant's memory "
        "saving shows against the O(L²) form.)",
        "",
        *bullets,
        "",
    ]


def _capacity_clause(by_dim: dict[int, str]) -> str:
    """ "recall capacity (pairs within 10 points of exact attention): 16 at head dim 16, ≥ 64 at
    head dim 32" — one variant's cells of the capacity table."""
    cells = ", ".join(f"{cell} at head dim {d}" for d, cell in by_dim.items())
    points = f"{capacity.WITHIN * 100:.0f} points"
    return f"recall capacity (pairs within {points} of exact attention): {cells}"


def _speed_clause(fused, quadratic) -> str | None:
    parts = []
    for fitted, against in ((fused, "SDPA"), (quadratic, "O(L²) attention")):
        if fitted is None or fitted.crossover is None:
            continue
        c = fitted.crossover
        if c.kind == CROSSED:
            parts.append(f"faster than {against} from L≈{c.length:,.0f}")
        elif c.kind == ALWAYS_FASTER:
            parts.append(f"faster than {against} at every length measured (from {c.length:,.0f})")
        elif c.kind == NEVER:
            parts.append(f"slower than {against} up to {c.length:,.0f}")
        elif c.kind == REFERENCE_FAILED:
            parts.append(f"runs where {against} ended {c.reference_status} (from {c.length:,.0f})")
        else:
            continue
        if c.uncertain:
            parts[-1] += f" ({UNCERTAIN})"
    return ", ".join(parts) or None


def _memory_clause(memory: pd.DataFrame | None, name: str, references) -> str | None:
    """ "kernel 12.0 MiB at L=8,192: 1.6× less than SDPA, 85× less than O(L²) (at 4,096)"."""
    if memory is None or memory.empty:
        return None
    mine = memory[memory["series"] == name].set_index(SEQ_LEN)["mean"]
    if mine.empty:
        return None
    longest = mine.index.max()
    text = f"kernel memory {mine[longest] / MIB:,.1f} MiB at L={longest:,.0f}"
    factors = []
    for baseline, against in ((series.FUSED, "SDPA"), (series.QUADRATIC, "O(L²)")):
        reference = references[baseline].get(name)
        factor = None if reference is None else memory_factor(memory, name, reference)
        if factor is None:
            continue
        at, ratio = factor
        factors.append(
            f"{factor_text(ratio)} than {against}" + (f" (at {at:,.0f})" if at != longest else "")
        )
    if factors:
        text += ": " + ", ".join(factors)
    return text


def memory_factor(memory: pd.DataFrame, name: str, reference: str) -> tuple[float, float] | None:
    """(L, the `reference` series' mean / series `name`'s) at the longest seq_len where both
    have a value in `memory` (`series.mean_spread` of a memory column); None where none."""
    mine = memory[memory["series"] == name].set_index(SEQ_LEN)["mean"]
    theirs = memory[memory["series"] == reference].set_index(SEQ_LEN)["mean"]
    common = [length for length in theirs.index if length in mine.index]
    if not common:
        return None
    at = max(common)
    return at, theirs[at] / mine[at]


def factor_text(ratio: float) -> str:
    """ "2.5× less" for a reference that holds 2.5 times as much, "1.6× more" for 1 / 1.6."""
    if ratio >= 1:
        return f"{ratio:,.1f}× less"
    return f"{1 / ratio:,.1f}× more"


def _accuracy_cost(quality: pd.DataFrame) -> dict[str, str]:
    """attention name -> "accuracy 61.0 % vs exact 100.0 % at L=1,024 (−39.0 points)", at the
    longest length where exact attention reached the ceiling; {} without such a length. A
    variant whose job never reached 90 % at any stage gets "not learned in N steps (control
    x %)" instead: not learning is a result, never an accuracy difference."""
    trained = series.trained_quality(quality, ACCURACY)
    if trained.empty:
        return {}
    trained = accuracy.with_learned(trained)
    mean = trained.groupby([ATTENTION, SEQ_LEN])[ACCURACY].mean()
    exact = mean.get(series.REFERENCE)
    if exact is None:
        return {}
    solved = exact[exact >= CEILING]
    if solved.empty:
        return {}
    length = solved.index.max()
    task = format_value(trained[TASK].iloc[0])
    # A reduced run says how long it trained: slow learners are not yet where they end up.
    at_length = trained[trained[SEQ_LEN] == length]
    steps = accuracy.steps_behind(at_length)
    after = f" after {format_value(steps.max())} steps" if steps.notna().any() else ""
    clauses = {}
    for attention, by_length in mean.groupby(level=ATTENTION):
        if attention == series.REFERENCE or (attention, length) not in mean.index:
            continue
        records = trained[trained[ATTENTION] == attention]
        if not records["job_learned"].any():
            clauses[str(attention)] = f"{task}: {accuracy.not_learned_text(records)}"
            continue
        mine = by_length.loc[(attention, length)]
        points = (mine - exact[length]) * 100
        signed = f"{points:+.1f}".replace("-", "−")
        partly = (
            ""
            if records["job_learned"].all()
            else f"; only {records.loc[records['job_learned'], 'job_key'].nunique()} of "
            f"{records['job_key'].nunique()} seeds learned"
        )
        clauses[str(attention)] = (
            f"{task} accuracy{after} {mine:.1%} vs exact {exact[length]:.1%} at L={length:,.0f} "
            f"({signed} points{partly})"
        )
    return clauses
