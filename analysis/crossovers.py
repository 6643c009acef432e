"""Print each variant's crossover lengths and in-job speed-ups over exact attention.

    python -m analysis.crossovers multirun/scaling [more results ...]

The same table as report.md's "Speed-up over exact attention" (`analysis.kernel_time.speedups`),
from the records' `speedup_vs_sdpa` (and `speedup_vs_math`) columns, without building the
figures: the quick way to compare the crossovers of two runs.
"""

from __future__ import annotations

import argparse
import sys

from analysis import kernel_time, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="sweep dirs, results.csv/.parquet files")
    args = parser.parse_args(argv)
    try:
        frame = load.tidy(load.load_results(args.results))
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    table = kernel_time.speedups(frame) if not frame.empty else None
    if table is None:
        print(
            f"error: no efficient variant with speedup_vs_sdpa in {', '.join(args.results)}",
            file=sys.stderr,
        )
        return 1
    print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
