"""Scaling laws from measured points: power-law exponents and crossover lengths.

Pure functions of arrays (no DataFrames): `analysis.scaling_fits` applies them per variant.

- Exponent: the least-squares slope of log(cost) against log(seq_len), so cost ≈ c·L^α; the
  optional `tail` fits only the longest lengths (overheads flatten the short-length end).
- Crossover: the length where a variant's cost falls below the reference's (exact attention).
  The two measured lengths it lies between come from the signs of the log cost ratio; where in
  that stretch, from a straight line through log ratio against log L, fitted by least squares
  with weights that fall with the distance from the crossing (`BANDWIDTH_OCTAVES`). The ratio
  comes from two series' costs (`crossover_length`) or from speed-ups measured in each job with
  their spread (`crossover_from_speedups`), which also says when the spread makes it uncertain.

Why a weighted fit rather than interpolation (measured): docs/internals-analysis.md, "fit".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

# The width (standard deviation, in octaves of L) of the weights of the crossover's local fit.
BANDWIDTH_OCTAVES = 1.0
# Re-centring rounds of that fit (the weights follow its crossing; three settle it).
_REFITS = 3


@dataclass(frozen=True)
class PowerLaw:
    """cost ≈ prefactor · length ** exponent, fitted on `n_points` distinct lengths."""

    exponent: float
    prefactor: float
    n_points: int

    def __call__(self, length: np.ndarray | float) -> np.ndarray | float:
        return self.prefactor * np.asarray(length, dtype=float) ** self.exponent

    @property
    def ok(self) -> bool:
        return math.isfinite(self.exponent)

    def __str__(self) -> str:
        return f"{self.exponent:.2f}" if self.ok else "n/a"


def fit_power_law(lengths, costs, *, tail: int | None = None) -> PowerLaw:
    """Least-squares fit of log(costs) = α·log(lengths) + log(c) over positive finite points.

    Repeated lengths (seeds) are averaged first, so each length weighs the same. `tail` keeps
    only the `tail` longest lengths. Fewer than two distinct lengths give exponent NaN.
    """
    x, y = _positive_points(lengths, costs)
    if tail is not None:
        x, y = x[-tail:], y[-tail:]
    if len(x) < 2:
        return PowerLaw(math.nan, math.nan, len(x))
    slope, intercept = np.polyfit(np.log(x), np.log(y), deg=1)
    return PowerLaw(float(slope), float(math.exp(intercept)), len(x))


# Kinds of crossover result.
CROSSED = "crossed"  # slower, then faster: `length` interpolated between two measured lengths
ALWAYS_FASTER = "always_faster"  # faster at every common length: `length` is the shortest
NEVER = "never"  # slower at the longest common length: `length` is that length
REFERENCE_FAILED = "reference_failed"  # slower where both ran, but the variant ran at `length`
#                                       where the reference failed (oom/timeout/...)
NO_OVERLAP = "no_overlap"  # no length where both have a cost: `length` is NaN


@dataclass(frozen=True)
class Crossover:
    """Where a variant becomes cheaper than the reference; see the kinds above."""

    kind: str
    length: float
    reference_status: str = ""  # the reference's status at `length` for REFERENCE_FAILED
    # The timing spread at the measured lengths that decide it is wider than the speed-up's
    # distance from 1 (`crossover_from_speedups`): another run may well move it.
    uncertain: bool = False

    def __str__(self) -> str:
        """ "1,469" (crossed), "≤256" (always faster), ">2,048" (never), "≤4,096 (exact oom)";
        an uncertain one "≈1,469 (uncertain)"."""
        if self.kind == CROSSED:
            text = f"{'≈' if self.uncertain else ''}{self.length:,.0f}"
        elif self.kind == ALWAYS_FASTER:
            text = f"≤{self.length:,.0f}"
        elif self.kind == NEVER:
            text = f">{self.length:,.0f}"
        elif self.kind == REFERENCE_FAILED:
            return f"≤{self.length:,.0f} (exact {self.reference_status})"
        else:
            return "n/a"
        return text + (" (uncertain)" if self.uncertain else "")


def crossover_length(lengths, costs, ref_lengths, ref_costs, *, ref_failed=None) -> Crossover:
    """The length above which a variant costs less than the reference (exact attention).

    `lengths, costs` and `ref_lengths, ref_costs` are the measured points of the variant and the
    reference (repeated lengths are averaged). `ref_failed` maps lengths where the reference has
    no cost to its status there ("oom", "timeout"), for REFERENCE_FAILED. The crossover is the
    last change from slower to faster, so the variant is faster at every longer common length;
    a variant that is slower at the longest common length has no crossover (NEVER), even if it
    was faster somewhere shorter. Equal cost counts as faster.
    """
    x, y = _positive_points(lengths, costs)
    rx, ry = _positive_points(ref_lengths, ref_costs)
    common, mine, theirs = np.intersect1d(x, rx, return_indices=True)
    if len(common) == 0:
        return _reference_failed(x, ref_failed, above=0.0) or Crossover(NO_OVERLAP, math.nan)
    log_ratio = np.log(y[mine]) - np.log(ry[theirs])
    if log_ratio[-1] > 0:
        return _reference_failed(x, ref_failed, above=common[-1]) or Crossover(NEVER, common[-1])
    crossover, _ = _from_log_ratio(common, log_ratio)
    return crossover


def crossover_from_speedups(lengths, speedups, spreads=None) -> Crossover:
    """The length above which a variant is faster than the reference, from speed-ups measured
    in the variant's own jobs (reference time / variant time, e.g. `speedup_vs_sdpa`), with
    the same rules and interpolation as `crossover_length` (log cost ratio = −log speed-up).

    `spreads` (e.g. `speedup_vs_sdpa_iqr`, same length as `speedups`; repeated lengths are
    averaged) mark the result `uncertain` when, at a measured length that decides it (the two
    around a crossover, the longest for NEVER, the shortest for ALWAYS_FASTER), the spread is
    wider than the speed-up's distance from 1. No points give NO_OVERLAP.
    """
    x, y = _positive_points(lengths, speedups)
    if len(x) == 0:
        return Crossover(NO_OVERLAP, math.nan)
    crossover, deciding = _from_log_ratio(x, -np.log(y))
    if spreads is None:
        return crossover
    # Spreads averaged per length like the speed-ups (a missing spread counts as none).
    spread = dict(
        zip(*_mean_per_length(lengths, np.nan_to_num(np.asarray(spreads, float))), strict=True)
    )
    uncertain = any(spread.get(x[i], 0.0) > abs(y[i] - 1.0) for i in deciding)
    return dataclasses.replace(crossover, uncertain=uncertain)


def _from_log_ratio(lengths: np.ndarray, log_ratio: np.ndarray) -> tuple[Crossover, list[int]]:
    """The crossover of a log cost ratio (variant / reference) over sorted distinct `lengths`,
    and the indices of the lengths that decide it. Equal cost counts as faster."""
    if log_ratio[-1] > 0:
        return Crossover(NEVER, float(lengths[-1])), [len(lengths) - 1]
    slower = np.flatnonzero(log_ratio > 0)
    if len(slower) == 0:
        return Crossover(ALWAYS_FASTER, float(lengths[0])), [0]
    j = slower[-1]  # log_ratio[j] > 0 >= log_ratio[j + 1]
    t = log_ratio[j] / (log_ratio[j] - log_ratio[j + 1])
    log_length = np.log(lengths[j]) + t * (np.log(lengths[j + 1]) - np.log(lengths[j]))
    # The fit starts at the last slower stretch: an earlier faster length is another regime.
    first = j
    while first > 0 and log_ratio[first - 1] > 0:
        first -= 1
    log_length = _local_crossing(np.log(lengths[first:]), log_ratio[first:], log_length)
    return Crossover(CROSSED, float(np.exp(log_length))), [j, j + 1]


def _local_crossing(log_x: np.ndarray, log_ratio: np.ndarray, start: float) -> float:
    """Where a weighted least-squares line through (log_x, log_ratio) crosses 0, the weights a
    Gaussian in log2 L of `BANDWIDTH_OCTAVES` around the crossing, starting from `start` (the
    interpolated one). Falls back to `start` if the line does not fall through 0 inside the
    fitted lengths (fewer than three points, or a flat or rising ratio)."""
    if len(log_x) < 3:
        return start
    centre = start
    for _ in range(_REFITS):
        octaves = (log_x - centre) / math.log(2.0)
        weights = np.exp(-0.5 * (octaves / BANDWIDTH_OCTAVES) ** 2)
        slope, intercept = np.polyfit(log_x, log_ratio, deg=1, w=np.sqrt(weights))
        if not slope < 0:
            return start
        centre = -intercept / slope
    return centre if log_x[0] <= centre <= log_x[-1] else start


def _reference_failed(x: np.ndarray, ref_failed, *, above: float) -> Crossover | None:
    """The shortest length above `above` where the variant ran and the reference failed."""
    failed = sorted(float(length) for length in (ref_failed or {}) if length > above)
    reached = [length for length in failed if np.any(x == length)]
    if not reached:
        return None
    return Crossover(REFERENCE_FAILED, reached[0], str(ref_failed[reached[0]]))


def _positive_points(lengths, costs) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct lengths with the mean positive finite cost at each."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(costs, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    return _mean_per_length(x[keep], y[keep])


def _mean_per_length(lengths, values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct lengths with the mean of `values` at each."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    distinct, inverse = np.unique(x, return_inverse=True)
    means = np.bincount(inverse, weights=y, minlength=len(distinct)) / np.bincount(inverse)
    return distinct, means
