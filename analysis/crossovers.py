"""Print each variant's crossover lengths and in-job speed-ups over exact attention.

    python -m analysis.crossovers multirun/scaling [more results ...]
    python -m analysis.crossovers QUIET --beside BUSY [--labels quiet busy]    # two runs

The same table as report.md's "Speed-up over exact attention" (`analysis.kernel_time.speedups`),
from the records' `speedup_vs_sdpa` (and `speedup_vs_math`) columns, without building the
figures. `--beside` compares two runs of one sweep (docs/report.md's quiet and busy machine):
per variant L* vs SDPA in each, how far apart (the larger over the smaller) and the speed-ups
at the longest length both measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import fit, kernel_time, load, series
from analysis.column_names import ATTN_FWD_BWD_MS, SEQ_LEN, SPEEDUP_VS_SDPA
from analysis.markdown_table import Table, format_length
from analysis.scaling_fits import scaling_fits


def crossovers(frame: pd.DataFrame) -> tuple[dict[str, fit.Crossover], pd.DataFrame]:
    """Per series (its label) L* vs SDPA (forward+backward) and the median speed-up per length:
    a frame of `series`, seq_len, `mean`."""
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    fits = scaling_fits(labelled, keys, ATTN_FWD_BWD_MS, baseline=series.FUSED)
    found = {name: f.crossover for name, f in fits.items() if f.crossover is not None}
    return found, series.mean_spread(labelled, SEQ_LEN, SPEEDUP_VS_SDPA)


def side_by_side(first: pd.DataFrame, second: pd.DataFrame, labels: tuple[str, str]) -> Table:
    """The L* of each series in both runs, how far apart, and the speed-ups at the longest
    length both measured it at."""
    (one, speed_one), (two, speed_two) = crossovers(first), crossovers(second)
    rows = []
    for name in sorted(set(one) & set(two)):
        a, b = one[name], two[name]
        crossed = a.kind == b.kind == fit.CROSSED
        apart = f"{max(a.length, b.length) / min(a.length, b.length):.2f}×" if crossed else "—"
        mine = [s[s["series"] == name].set_index(SEQ_LEN)["mean"] for s in (speed_one, speed_two)]
        common = sorted(set(mine[0].index) & set(mine[1].index))
        at = f"{mine[0][common[-1]]:.2f} / {mine[1][common[-1]]:.2f}" if common else "—"
        length = format_length(common[-1]) if common else "—"
        rows.append(
            {
                "variant": name,
                f"L* vs SDPA, {labels[0]}": str(a),
                f"L* vs SDPA, {labels[1]}": str(b),
                "apart": apart,
                f"speed-up at the longest common length ({labels[0]} / {labels[1]})": f"{at} "
                f"at {length}",
            }
        )
    note = (
        "L* from each run's in-job speed-ups (forward+backward against SDPA, fitted in log L); "
        "apart: the larger L* over the smaller, where both runs crossed."
    )
    return Table(f"Crossovers, {labels[0]} and {labels[1]}", pd.DataFrame(rows), note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="sweep dirs, results.csv/.parquet files")
    parser.add_argument("--beside", metavar="RESULTS", help="a second run of the same sweep")
    parser.add_argument(
        "--labels", nargs=2, metavar=("FIRST", "SECOND"), help="the two runs' names (--beside)"
    )
    args = parser.parse_args(argv)
    if args.labels and not args.beside:
        parser.error("argument --labels: names the two runs of --beside, which is not given")
    try:
        frame = load.tidy(load.load_results(args.results))
        other = load.tidy(load.load_results([args.beside])) if args.beside else None
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if other is not None:
        labels = tuple(args.labels or (_label(args.results[0]), _label(args.beside)))
        if labels[0] == labels[1]:
            labels = (labels[0], f"{labels[1]} (2)")
        print(side_by_side(frame, other, labels).markdown())
        return 0
    table = kernel_time.speedups(frame) if not frame.empty else None
    if table is None:
        print(
            f"error: no efficient variant with speedup_vs_sdpa in {', '.join(args.results)}",
            file=sys.stderr,
        )
        return 1
    print(table.markdown())
    return 0


def _label(path: str) -> str:
    """A run's name in the table: its file's or folder's stem."""
    return Path(path).stem


if __name__ == "__main__":
    sys.exit(main())
