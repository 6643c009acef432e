"""Per series: scaling exponent and crossover length against exact attention, from the frame.

The figures' legends and report.md's tables both come from `scaling_fits`, so they agree.
Fits use each length's mean over seeds (`series.mean_spread`). The crossover comes from the
speed-ups each job measured against exact attention in alternating rounds (`SPEEDUPS`:
`speedup_vs_sdpa`, ...) where the records have them; older records without them are compared
with the exact-attention series of the same context (`series.reference_of`), timed in other
jobs.

Read by the kernel-time section (`analysis.kernel_time`: its tables and figure), the memory
figure's exponents, the head-dim tables, the headline and the glance table.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis import fit, series
from analysis.column_names import (
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_MS,
    FWD_SPEEDUP_VS_SDPA,
    SEQ_LEN,
    SPEEDUP_VS_MATH,
    SPEEDUP_VS_SDPA,
    STATUS,
)

TIME_METRICS = {"fwd": ATTN_FWD_MS, "fwd+bwd": ATTN_FWD_BWD_MS}
X = SEQ_LEN
TAIL = 3  # the longest lengths the asymptotic exponent is fitted on
# (time metric, exact attention's impl) -> the in-job speed-up column (its spread: + "_iqr").
SPEEDUPS = {
    (ATTN_FWD_BWD_MS, series.FUSED): SPEEDUP_VS_SDPA,
    (ATTN_FWD_MS, series.FUSED): FWD_SPEEDUP_VS_SDPA,
    (ATTN_FWD_BWD_MS, series.QUADRATIC): SPEEDUP_VS_MATH,
}


# A job that timed its kernel against SDPA only gets its speed-up over the O(L²) form through
# the O(L²) job's own in-job ratio against SDPA at the same length and context: t_math / t_X =
# (t_sdpa / t_X) / (t_sdpa / t_math). Both factors are ratios of calls timed side by side, so a
# load change between jobs cancels as it does for the measured column; the main job times the
# O(L²) form in one job per length instead of in every job (those rounds were most of its time).
CHAINED = {SPEEDUP_VS_MATH: (SPEEDUP_VS_SDPA, series.QUADRATIC)}


def with_chained_speedups(labelled: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`labelled` (from `series.with_series`) with each `CHAINED` column filled where a record
    lacks it but has the column it is chained through and its context has an exact-attention
    series of that impl with the same column at the same seq_len (mean over seeds). The IQR
    of a chained value adds the two factors' relative IQRs (first order, on the safe side).
    Measured values are never replaced; the O(L²) series itself gets none."""
    out = labelled.copy()
    for column, (through, impl) in CHAINED.items():
        references = series.reference_of(labelled, keys, impl)
        if through not in labelled or not references:
            continue
        spread, through_spread = f"{column}_iqr", f"{through}_iqr"
        for name in (column, spread):
            if name not in out:
                out[name] = float("nan")
        factors = _means(labelled, through)  # (series, seq_len) -> mean over seeds
        factor_spreads = _means(labelled, through_spread) if through_spread in labelled else {}
        rows = out[through].notna() & out[column].isna() & out["series"].isin(list(references))
        for index, row in out[rows].iterrows():
            at = (references[row["series"]], row[X])
            if at not in factors:
                continue
            value = row[through] / factors[at]
            relative = _relative(row.get(through_spread), row[through]) + _relative(
                factor_spreads.get(at), factors[at]
            )
            out.loc[index, column] = value
            out.loc[index, spread] = value * relative
    return out


def _means(labelled: pd.DataFrame, column: str) -> dict[tuple[str, float], float]:
    """(series, seq_len) -> the mean of `column` over that length's records (`mean_spread`)."""
    stats = series.mean_spread(labelled, X, column)
    rows = zip(stats["series"], stats[X], stats["mean"], strict=True)
    return {(name, x): mean for name, x, mean in rows}


def _relative(iqr, value: float) -> float:
    """iqr / value, 0 when the IQR was not recorded."""
    return 0.0 if iqr is None or pd.isna(iqr) else float(iqr) / float(value)


@dataclass(frozen=True)
class SeriesFit:
    """One series' scaling of one metric: exponent over all lengths and over the longest ones."""

    power_law: fit.PowerLaw
    tail_power_law: fit.PowerLaw
    crossover: fit.Crossover | None  # None for exact attention itself or without a reference


def scaling_fits(
    labelled: pd.DataFrame,
    keys: list[str],
    metric: str,
    *,
    tail: int = TAIL,
    baseline: str = series.FUSED,
) -> dict[str, SeriesFit]:
    """Fits of `metric` against seq_len for every series of a frame from `series.with_series`.

    `tail` is the number of longest lengths of the second (asymptotic) exponent; crossovers
    are against exact attention with `impl=baseline`: from the series' in-job speed-ups
    (`SPEEDUPS`, with their spread) where it has them, else against the exact-attention series
    of the same context (`series.reference_of`). Exact attention has none against itself.
    """
    stats = series.mean_spread(labelled, X, metric)
    failed = series.failures(labelled, X)
    references = series.reference_of(labelled, keys, baseline)
    speedup = SPEEDUPS.get((metric, baseline))
    if speedup in CHAINED:
        labelled = with_chained_speedups(labelled, keys)
    ratios = series.mean_spread(labelled, X, speedup) if speedup in labelled else None
    spread = f"{speedup}_iqr"
    spreads = series.mean_spread(labelled, X, spread) if spread in labelled else None
    fits = {}
    for name in series.series_order(labelled):
        points = stats[stats["series"] == name]
        crossover = None
        measured = None if ratios is None else ratios[ratios["series"] == name]
        if measured is not None and len(measured) and not _is_baseline(labelled, name, baseline):
            iqr = None
            if spreads is not None:
                by_length = spreads[spreads["series"] == name].set_index(X)["mean"]
                iqr = [by_length.get(length, 0.0) for length in measured[X]]
            crossover = fit.crossover_from_speedups(measured[X], measured["mean"], iqr)
        elif name in references:
            ref = stats[stats["series"] == references[name]]
            crossover = fit.crossover_length(
                points[X],
                points["mean"],
                ref[X],
                ref["mean"],
                ref_failed=_failed_lengths(failed, references[name], set(ref[X])),
            )
        fits[name] = SeriesFit(
            fit.fit_power_law(points[X], points["mean"]),
            fit.fit_power_law(points[X], points["mean"], tail=tail),
            crossover,
        )
    return fits


def _is_baseline(labelled: pd.DataFrame, name: str, baseline: str) -> bool:
    """Whether series `name` is exact attention in the `baseline` form itself."""
    rows = labelled[labelled["series"] == name]
    if rows[ATTENTION].iloc[0] != series.REFERENCE:
        return False
    impl = rows["attention.impl"].iloc[0] if "attention.impl" in rows else None
    impl = impl if isinstance(impl, str) else series.FUSED
    return impl == baseline or (baseline == series.FUSED and impl in series.FUSED_PINNED)


def _failed_lengths(failed: pd.DataFrame, name: str, measured: set) -> dict[float, str]:
    """Lengths where series `name` has no measurement but failed, with its status there."""
    rows = failed[(failed["series"] == name) & ~failed[X].isin(measured)]
    return {float(r[X]): str(r[STATUS]) for _, r in rows.iterrows()}


def longest_common_length(labelled: pd.DataFrame, metric: str) -> float | None:
    """The longest seq_len at which every series that has any value of `metric` has one."""
    stats = series.mean_spread(labelled, X, metric)
    if stats.empty:
        return None
    per_series = [set(group[X]) for _, group in stats.groupby("series")]
    common = set.intersection(*per_series)
    return max(common) if common else None
