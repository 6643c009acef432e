"""Exponent fits and crossover detection on synthetic costs with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import fit

LENGTHS = np.array([256, 512, 1024, 2048, 4096], dtype=float)


def test_power_law_recovers_exponent_and_prefactor():
    law = fit.fit_power_law(LENGTHS, 3.0 * LENGTHS**1.5)
    assert law.exponent == pytest.approx(1.5, abs=1e-12)
    assert law.prefactor == pytest.approx(3.0, rel=1e-9)
    assert law.n_points == 5
    assert law(1000.0) == pytest.approx(3.0 * 1000.0**1.5)
    assert str(law) == "1.50"


def test_power_law_under_multiplicative_noise():
    rng = np.random.default_rng(0)
    lengths = np.repeat(LENGTHS, 3)  # three seeds per length, averaged before fitting
    costs = 1e-6 * lengths**2 * np.exp(rng.normal(0.0, 0.05, lengths.size))
    assert fit.fit_power_law(lengths, costs).exponent == pytest.approx(2.0, abs=0.05)


def test_one_slow_end_point_moves_the_fit_less_than_a_two_point_ratio():
    lengths = [4096, 8192, 16384, 32768]
    noisy = [n * (1.2 if n == lengths[-1] else 1.0) for n in lengths]
    fitted = fit.fit_power_law(lengths, noisy).exponent
    two_point = math.log(noisy[-1] / noisy[0]) / math.log(lengths[-1] / lengths[0])
    assert 1 < fitted < two_point


def test_power_law_tail_fits_only_the_longest_lengths():
    # Constant overhead dominates short lengths; the tail sees the quadratic regime.
    costs = 50.0 + 1e-4 * LENGTHS**2
    assert fit.fit_power_law(LENGTHS, costs).exponent < 1.5
    assert fit.fit_power_law(LENGTHS, costs, tail=2).exponent == pytest.approx(1.9, abs=0.05)


def test_power_law_ignores_missing_and_needs_two_lengths():
    law = fit.fit_power_law([256, 512, 1024], [1.0, float("nan"), 0.0])
    assert math.isnan(law.exponent) and law.n_points == 1 and str(law) == "n/a"
    assert fit.fit_power_law([256, 512, 512], [1.0, 2.0, 2.0]).exponent == pytest.approx(1.0)


def test_crossover_of_linear_against_quadratic_is_exact():
    # 1e-6·L² = 1e-3·L at L = 1000, between the measured 512 and 1024.
    crossover = fit.crossover_length(LENGTHS, 1e-3 * LENGTHS, LENGTHS, 1e-6 * LENGTHS**2)
    assert crossover.kind == fit.CROSSED
    assert crossover.length == pytest.approx(1000.0, rel=1e-9)
    assert str(crossover) == "1,000"


def test_crossover_uses_only_common_lengths():
    variant_lengths = np.array([128, 512, 2048, 8192], dtype=float)
    crossover = fit.crossover_length(
        variant_lengths, 2.5e-4 * variant_lengths**1.2, LENGTHS, 1e-6 * LENGTHS**2
    )
    expected = (2.5e-4 / 1e-6) ** (1 / 0.8)  # 2.5e-4·L^1.2 = 1e-6·L², ≈ 995
    assert crossover.kind == fit.CROSSED
    assert crossover.length == pytest.approx(expected, rel=1e-9)


def test_crossover_is_the_last_change_from_slower_to_faster():
    ratio = np.array([0.5, 2.0, 0.9, 0.5, 0.25])  # faster, slower, then faster for good
    crossover = fit.crossover_length(LENGTHS, ratio, LENGTHS, np.ones(5))
    assert crossover.kind == fit.CROSSED and 512 < crossover.length < 1024
    # The earlier faster length is another regime: it does not move the crossing.
    other = fit.crossover_length(LENGTHS, [0.1, *ratio[1:]], LENGTHS, np.ones(5))
    assert other.length == crossover.length


def test_one_noisy_job_moves_the_fitted_crossover_less_than_interpolation():
    """Speed-ups L / 800 (crossing 1 at 800), with the job at 512 measured 25 % fast: the
    straight line through 512 and 1024 crosses at 2**(log2(512) + t), t = -log s512 /
    log(s1024 / s512); the fit, which also hears the jobs at 256, 2048 and 4096, stays closer."""
    speedups = LENGTHS / 800.0
    noisy = speedups.copy()
    noisy[1] *= 1.25
    t = -math.log(noisy[1]) / math.log(noisy[2] / noisy[1])
    interpolated = 512 * 2**t
    fitted = fit.crossover_from_speedups(LENGTHS, noisy).length
    assert fit.crossover_from_speedups(LENGTHS, speedups).length == pytest.approx(800, rel=1e-9)
    assert interpolated < fitted < 800  # pulled the same way, less far


def test_always_faster_and_never():
    faster = fit.crossover_length(LENGTHS, 0.5 * LENGTHS, LENGTHS, LENGTHS)
    assert (faster.kind, faster.length, str(faster)) == (fit.ALWAYS_FASTER, 256.0, "≤256")
    # Faster in the middle but slower at the longest length: no crossover.
    never = fit.crossover_length(LENGTHS, [2.0, 0.5, 0.5, 0.5, 2.0], LENGTHS, np.ones(5))
    assert (never.kind, never.length, str(never)) == (fit.NEVER, 4096.0, ">4,096")


def test_reference_failure_beyond_the_common_lengths():
    ref_lengths = LENGTHS[:3]
    crossover = fit.crossover_length(
        LENGTHS, 2.0 * LENGTHS, ref_lengths, LENGTHS[:3], ref_failed={2048: "oom", 4096: "oom"}
    )
    assert crossover.kind == fit.REFERENCE_FAILED
    assert crossover.length == 2048.0
    assert str(crossover) == "≤2,048 (exact oom)"


def test_no_overlap():
    crossover = fit.crossover_length([256.0], [1.0], [512.0], [1.0])
    assert crossover.kind == fit.NO_OVERLAP and str(crossover) == "n/a"


def test_a_crossover_from_in_job_speedups():
    # Speed-ups 0.8 at 512 and 1.25 at 1024: log speed-up -0.22 and +0.22, so 1 halfway in log L.
    lengths, speedups = [256, 512, 1024, 2048], [0.5, 0.8, 1.25, 2.0]
    crossed = fit.crossover_from_speedups(lengths, speedups, [0.1] * 4)
    assert crossed.kind == fit.CROSSED and crossed.length == pytest.approx((512 * 1024) ** 0.5)
    assert not crossed.uncertain and str(crossed) == "724"
    # The spread at a length around the crossing is wider than its distance to 1 (0.2).
    shaky = fit.crossover_from_speedups(lengths, speedups, [0.0, 0.3, 0.0, 0.0])
    assert shaky.uncertain and str(shaky) == "≈724 (uncertain)"
    assert fit.crossover_from_speedups([256, 512], [1.5, 2.0]).kind == fit.ALWAYS_FASTER
    never = fit.crossover_from_speedups([256, 512], [0.5, 0.9], [0.0, 0.2])
    assert (never.kind, never.length, str(never)) == (fit.NEVER, 512, ">512 (uncertain)")
    assert fit.crossover_from_speedups([], []).kind == fit.NO_OVERLAP
