"""Records of the presets (a scaling sweep, MAD, ListOps, capacity) for the analysis tests: tidy
frames."""

from __future__ import annotations

import pandas as pd

from analysis import load, suites

CAPACITY_PAIRS = (4, 8, 16, 32, 64)


def crossing_sweep(crossings, lengths, extra=lambda length, cost: {}) -> pd.DataFrame:
    """Synthetic scaling records: for each (name, crossover) of `crossings` a kernel costing
    1e-5·crossover·L ms forward (crossover None: exact attention, 1e-5·L²), so that it crosses
    exact attention at that length; forward+backward 3×; `extra(length, cost)` adds columns."""
    records = []
    for length in lengths:
        for name, crossover in crossings:
            cost = 1e-5 * length**2 if crossover is None else 1e-5 * crossover * length
            records.append(
                {
                    "status": "ok",
                    "attention": name,
                    "block": "residual",
                    "task": "random_lm",
                    "seq_len": length,
                    "attn_fwd_ms": cost,
                    "attn_fwd_bwd_ms": 3 * cost,
                    **extra(length, cost),
                    "timestamp": "2026-01-01T00:00:00",
                }
            )
    return load.tidy(pd.DataFrame(records))


KINDS = list(suites.MAD_COLUMNS.values())  # compression, fuzzy, in-context, memo, noisy, copy
LENGTHS = {"compression": 32, "memorization": 32}


def mad_sweep(
    scores: dict[str, list[float]], *, worse: float = 0.2, interval: float | None = None
) -> pd.DataFrame:
    """A MAD grid: per variant and kind two grid points (lr 1e-3 wd 0, lr 3e-3 wd 0.1), the
    second `scores` (the chosen one: better on validation), the first `worse` below it; with
    `interval`, Wilson bounds that far either side of each score."""
    rows = []
    for attention, values in scores.items():
        for kind, value in zip(KINDS, values, strict=True):
            for rate, decay, score in ((1e-3, 0.0, value - worse), (3e-3, 0.1, value)):
                rows.append(
                    {
                        "sweep": "mad",
                        "job": str(len(rows)),
                        "status": "ok",
                        "attention": attention,
                        "task": "mad",
                        "task.kind": kind,
                        "task.vocab_size": 256 if kind == "memorization" else 16,
                        "seq_len": LENGTHS.get(kind, 64),
                        "train.steps": 400,
                        "train.lr": rate,
                        "train.weight_decay": decay,
                        "train.stop_accuracy": 0.99,
                        "train.patience": 4,
                        "seed": 0,
                        "valid_accuracy": score,
                        "eval_accuracy": score,
                        "trained_steps": 400,
                        "learned": score >= 0.9,
                        "chance_accuracy": 1 / 8,
                        "floor_accuracy": 0.3 if "recall" in kind else 0.15,
                        **(
                            {}
                            if interval is None
                            else {
                                "eval_accuracy_ci_low": score - interval,
                                "eval_accuracy_ci_high": score + interval,
                            }
                        ),
                    }
                )
    return load.tidy(pd.DataFrame(rows))


def listops_sweep(scores: dict[str, float], seeds=(0,)) -> pd.DataFrame:
    rows = []
    for attention, value in scores.items():
        for seed in seeds:
            rows.append(
                {
                    "sweep": "listops",
                    "job": str(len(rows)),
                    "status": "ok",
                    "attention": attention,
                    "task": "listops",
                    "seq_len": 128,
                    "train.lr": 3e-3,
                    "train.steps": 1500,
                    "seed": seed,
                    "valid_accuracy": value,
                    "eval_accuracy": value + 0.01 * seed,
                    "eval_accuracy_ci_low": value - 0.04,
                    "eval_accuracy_ci_high": value + 0.04,
                    "trained_steps": 1500,
                    "learned": False,
                    "chance_accuracy": 0.1,
                    "floor_accuracy": 0.16,
                }
            )
    return load.tidy(pd.DataFrame(rows))


def capacity_sweep(jobs) -> pd.DataFrame:
    """A mixture-trained capacity sweep: per job (attention, accuracy per count of
    CAPACITY_PAIRS, extra columns) its own record at the smallest count and one evaluation
    point per other count (`<job>/n_pairs=P`); learned when its control reached 90 %."""
    rows = []
    for job, (attention, values, extra) in enumerate(jobs):
        for pairs, value in zip(CAPACITY_PAIRS, values, strict=True):
            own = pairs == CAPACITY_PAIRS[0]
            rows.append(
                {
                    "sweep": "capacity",
                    "job": str(job) if own else f"{job}/n_pairs={pairs}",
                    "status": "ok",
                    "attention": attention,
                    "task": "recall",
                    "task.n_pairs": pairs,
                    "task.train_pairs": "[4, 8, 16, 32, 64]",
                    "task.n_values": 256,
                    "seq_len": 256,
                    "seed": 0,
                    "eval_accuracy": value,
                    "learned": values[0] >= 0.9,
                    "chance_accuracy": 1 / 256,
                    "floor_accuracy": 1 / pairs,
                    **extra,
                }
            )
    return load.tidy(pd.DataFrame(rows))
