"""Per series: scaling exponent and crossover length against exact attention, from the frame.

The figures' legends and report.md's tables both come from `scaling_fits`, so they agree.
Fits use each length's mean over seeds (`series.mean_spread`). The crossover comes from the
speed-ups each job measured against exact attention in alternating rounds (`SPEEDUPS`:
`speedup_vs_sdpa`, ...) where the records have them; older records without them are compared
with the exact-attention series of the same context (`series.reference_of`), timed in other
jobs.

The kernel-time tables of report.md live here too, beside the fits they read: per variant
(`variant_summary`), the in-job speed-ups (`speedups`), timings not to take at face value
(`timing_warnings`) and kernels timed on the explicit path (`explicit_path`). The figures:
`analysis.figures.kernel_time`; the command that prints the speed-ups: `analysis.crossovers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis import fit, series
from analysis.column_names import (
    APPROX_REL_ERROR,
    ATTENTION,
    ATTN_FWD_BWD_MS,
    ATTN_FWD_BWD_PEAK_BYTES,
    ATTN_FWD_MS,
    BATCH_SIZE,
    CAUSAL,
    D_MODEL,
    DEVICE,
    DTYPE,
    FWD_SPEEDUP_VS_SDPA,
    HOSTNAME,
    JOB,
    KERNEL_PATH,
    N_HEADS,
    PEAK_MEMORY_BYTES,
    SEQ_LEN,
    SHARED_QK,
    SPEEDUP_VS_MATH,
    SPEEDUP_VS_SDPA,
    SPEEDUP_VS_SDPA_IQR,
    STATUS,
    SWAP_DELTA_BITS_PER_BYTE,
    SWEEP,
    THREADS,
    TIMING_WARNING,
)
from analysis.load import format_value
from analysis.markdown_table import Table, distinct, format_length, informative, with_keys
from experiments.records.record import MIB

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


# The per-variant table's columns at the longest common length: metric, title, scale, format.
AT_LONGEST = (
    (ATTN_FWD_MS, "fwd (ms)", 1, ".3g"),
    (ATTN_FWD_BWD_MS, "fwd+bwd (ms)", 1, ".3g"),
    (ATTN_FWD_BWD_PEAK_BYTES, "kernel memory (MiB)", MIB, ".1f"),
    (PEAK_MEMORY_BYTES, "step memory (MiB)", MIB, ".1f"),
    (APPROX_REL_ERROR, "rel. error", 1, ".3g"),
    (SWAP_DELTA_BITS_PER_BYTE, "swap Δ bits/byte", 1, ".3g"),
)


def variant_summary(frame: pd.DataFrame) -> Table | None:
    """Per series: exponents, crossover against exact attention, reach, kernel time, memory and
    error at the longest length every series reached. Columns without a value are left out."""
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    if labelled.empty:
        return None
    fits = {name: scaling_fits(labelled, keys, metric) for name, metric in TIME_METRICS.items()}
    quadratic = scaling_fits(labelled, keys, ATTN_FWD_BWD_MS, baseline=series.QUADRATIC)
    at_longest = [spec for spec in AT_LONGEST if spec[0] in labelled]  # older records lack some
    at = {
        metric: (
            longest_common_length(labelled, metric),
            series.mean_spread(labelled, SEQ_LEN, metric),
        )
        for metric, *_ in at_longest
    }
    several_lengths = labelled[SEQ_LEN].dropna().nunique() > 1
    rows = []
    for name in series.series_order(labelled):
        mine = labelled[labelled["series"] == name]
        fwd, fwd_bwd = fits["fwd"][name], fits["fwd+bwd"][name]
        row = {
            "series": name,
            "α fwd": str(fwd.power_law),
            "α fwd+bwd": str(fwd_bwd.power_law),
            f"α fwd+bwd, longest {TAIL} L": str(fwd_bwd.tail_power_law),
            "L* fwd": _crossover(fwd, name),
            "L* fwd+bwd": _crossover(fwd_bwd, name),
        }
        if any(f.crossover is not None for f in quadratic.values()):
            crossover = quadratic[name].crossover
            row["L* fwd+bwd vs O(L²)"] = "—" if crossover is None else str(crossover)
        if several_lengths:
            row["longest L ok"] = _longest_ok(mine)
        row["failed at"] = _first_failures(mine)
        for metric, title, scale, spec in at_longest:
            length, stats = at[metric]
            if length is not None:
                row[f"{title} @ L={format_length(length)}"] = _value_at(
                    stats, name, length, scale, spec
                )
        rows.append(row)
    table = informative(with_keys(rows, labelled, keys), also_empty=("reference",))
    notes = []
    if any(c.startswith("α") for c in table):
        notes.append(
            "α: least-squares slope of log(kernel time) against log(seq_len), over the mean per "
            f"length (all lengths, and the {TAIL} longest: the asymptotic regime)."
        )
    if any(c.startswith("L*") for c in table):
        notes.append(
            "L*: the length above which the variant's kernel is faster than exact attention "
            "(SDPA, same shape and causality), from the speed-up each job measured in rounds "
            "alternating the kernel with exact attention (`speedup_vs_sdpa`, median of the "
            "per-round ratios; records without it: against exact attention's own jobs), "
            "log-interpolated between measured lengths; ≤x: faster at every measured length; "
            ">x: still slower at the longest; (exact oom): exact attention failed there; "
            "(uncertain): the rounds' spread at the deciding lengths is wider than the "
            "speed-up's distance from 1. vs O(L²): against exact attention with explicit L×L "
            "scores (impl=math, `speedup_vs_math`: measured in the job, or chained through the "
            "O(L²) form's own job at that length as speedup_vs_sdpa / its speedup_vs_sdpa)."
        )
    if any("memory" in c for c in table):
        notes.append(
            "kernel memory: peak live tensors of the attention kernel alone in one "
            "forward+backward (saved activations, output, input gradients); step memory: of a "
            "whole training step."
        )
    if any(" @ L=" in c for c in table):
        notes.append(
            "@ L: at the longest length every series measuring that column reached; kernel "
            "times are medians of the kernel alone."
        )
    return Table("Per variant", table, " ".join(notes))


def speedups(frame: pd.DataFrame) -> Table | None:
    """Per series: the in-job speed-up over SDPA (forward+backward) at each length as "median
    (IQR)", and the crossovers it gives (against SDPA forward+backward and forward, and
    against the O(L²) form where measured). None when no record has `speedup_vs_sdpa`."""
    column = SPEEDUP_VS_SDPA
    if column not in frame or frame[column].isna().all():
        return None
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    median = series.mean_spread(labelled, SEQ_LEN, column)
    spread = SPEEDUP_VS_SDPA_IQR
    iqr = series.mean_spread(labelled, SEQ_LEN, spread) if spread in labelled else median
    against = {
        "L* vs SDPA": (ATTN_FWD_BWD_MS, series.FUSED),
        "L* fwd vs SDPA": (ATTN_FWD_MS, series.FUSED),
        "L* vs O(L²)": (ATTN_FWD_BWD_MS, series.QUADRATIC),
    }
    fits = {
        title: scaling_fits(labelled, keys, metric, baseline=baseline)
        for title, (metric, baseline) in against.items()
    }
    lengths = sorted(median[SEQ_LEN].unique())
    rows = []
    for name in series.series_order(labelled):
        mine = median[median["series"] == name].set_index(SEQ_LEN)["mean"]
        if mine.empty or fits["L* vs SDPA"][name].crossover is None:
            continue  # SDPA itself, or no speed-ups measured
        spreads = iqr[iqr["series"] == name].set_index(SEQ_LEN)["mean"]
        row = {"series": name}
        for title, fitted in fits.items():
            crossover = fitted[name].crossover
            row[title] = "—" if crossover is None else str(crossover)
        for length in lengths:
            cell = "—"
            if length in mine.index:
                cell = f"{mine[length]:.2f}"
                if spread in labelled and length in spreads.index:
                    cell += f" ({spreads[length]:.2f})"
            row[f"L={format_length(length)}"] = cell
        rows.append(row)
    if not rows:
        return None
    note = (
        "Speed-up: exact attention's time / the kernel's (forward+backward) in the same round, "
        "the median over rounds that alternate the kernel with SDPA (and the O(L²) form) in "
        "each job, with the ratios' interquartile range in brackets; above 1 the kernel is "
        "faster. L* is where it crosses 1, interpolated in log L; (uncertain): the spread at "
        "the deciding lengths is wider than the distance from 1."
    )
    table = informative(with_keys(rows, labelled, keys))
    return Table("Speed-up over exact attention, measured in each job", table, note)


# What a kernel's time depends on: records agreeing on all of these time the same kernel, so
# their times must agree (a different block, depth or task cannot matter to the kernel alone).
KERNEL_INPUTS = (
    SEQ_LEN,
    BATCH_SIZE,
    N_HEADS,
    D_MODEL,
    CAUSAL,
    DTYPE,
    DEVICE,
    THREADS,
    SHARED_QK,
    HOSTNAME,
    SWEEP,
)
KERNEL_DISAGREEMENT = 3.0  # a kernel time this many times the same kernel's fastest is flagged


def timing_warnings(frame: pd.DataFrame) -> Table | None:
    """Timings not to take at face value: a figure whose blocks spread widely (the record's
    `timing_warning`), and a kernel time that disagrees with the same kernel elsewhere in the
    sweep (same attention, options and shape, another block or depth: the kernel alone is timed,
    so its time cannot depend on them) by more than KERNEL_DISAGREEMENT×."""
    labelled, keys = series.with_series(frame)
    ok = labelled[labelled[STATUS] == "ok"]
    rows = []
    if TIMING_WARNING in ok:
        for _, rec in ok[ok[TIMING_WARNING].notna()].iterrows():
            rows.append({"series": rec["series"], JOB: rec[JOB], "warning": rec[TIMING_WARNING]})
    options = sorted(c for c in ok.columns if c.startswith("attention."))
    inputs = [c for c in (ATTENTION, *options, *KERNEL_INPUTS) if c in ok]
    for metric in TIME_METRICS.values():
        timed = ok[ok[metric].notna()]
        if timed.empty:
            continue
        same_kernel = timed[inputs].map(format_value).apply(tuple, axis=1)
        for _, group in timed.groupby(same_kernel, sort=False):
            fastest = group.loc[group[metric].idxmin()]
            for _, rec in group.iterrows():
                ratio = rec[metric] / fastest[metric]
                if ratio > KERNEL_DISAGREEMENT:
                    rows.append(
                        {
                            "series": rec["series"],
                            JOB: rec[JOB],
                            "warning": (
                                f"{metric} {rec[metric]:.3g} is {ratio:.0f}× the "
                                f"{fastest[metric]:.3g} of the same kernel in job "
                                f"{fastest[JOB]} ({fastest['series']})"
                            ),
                        }
                    )
    if not rows:
        return None
    note = (
        "Treat these figures with care: re-measure them (delete the record and re-run the sweep) "
        "on a quieter machine."
    )
    return Table("Timing warnings", with_keys(rows, labelled, keys), note)


def explicit_path(frame: pd.DataFrame) -> Table | None:
    """The series whose kernel ran in explicit matmuls (`kernel_path` explicit): no fused
    attention kernel on that device and dtype, or none at all (linear, performer), while exact
    attention's SDPA runs fused; their times are marked here."""
    if KERNEL_PATH not in frame:
        return None
    labelled, keys = series.with_series(frame)
    explicit = labelled[(labelled[STATUS] == "ok") & (labelled[KERNEL_PATH] == "explicit")]
    if explicit.empty:
        return None
    rows = [
        {
            "series": label,
            "jobs": ", ".join(map(str, group[JOB])),
            DEVICE: distinct(group[DEVICE]),
        }
        for label, group in explicit.groupby("series", sort=False)
    ]
    note = (
        "These kernels ran on the explicit path (`kernel_path`): their times are not those of a "
        "fused kernel, where exact attention's are."
    )
    return Table("Measured on the explicit path", with_keys(rows, labelled, keys), note)


def _crossover(f: SeriesFit, name: str) -> str:
    if f.crossover is not None:
        return str(f.crossover)
    # No crossover: exact attention is the reference itself; any other series had no
    # measurement to compare (e.g. every job skipped).
    return "reference" if name.startswith(series.REFERENCE) else "—"


def _longest_ok(rows: pd.DataFrame) -> str:
    ok = rows.loc[rows[STATUS] == "ok", SEQ_LEN].dropna()
    return format_length(ok.max()) if len(ok) else "—"


def _first_failures(rows: pd.DataFrame) -> str:
    """The status at the shortest failed length, e.g. "oom at 8,192"."""
    failed = rows[rows[STATUS] != "ok"].dropna(subset=[SEQ_LEN])
    if failed.empty:
        return ""
    shortest = failed[SEQ_LEN].min()
    statuses = ",".join(dict.fromkeys(failed.loc[failed[SEQ_LEN] == shortest, STATUS]))
    return f"{statuses} at {format_length(shortest)}"


def _value_at(stats: pd.DataFrame, name: str, length, scale: float, spec: str = ".1f") -> str:
    if length is None:
        return "—"
    match = stats[(stats["series"] == name) & (stats[SEQ_LEN] == length)]
    return format(match["mean"].iloc[0] / scale, spec) if len(match) else "—"
