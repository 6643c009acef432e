"""`python -m analysis.not_learned [SWEEP ...] [--probes DIR]`: the covering-pattern probes
(analysis/coverage.py) as a table, or with sweeps a sentence per not-learned row of their
capacity and long-range tables.

    python -m analysis.not_learned                                  # every probe (the snapshot)
    python -m analysis.not_learned multirun/capacity multirun/long_range_quick   # the sentences
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis import accuracy, capacity, coverage, series
from analysis.column_names import ATTENTION, SEQ_LEN
from analysis.load import load_results


def main(argv: list[str] | None = None) -> None:
    """`python -m analysis.not_learned [SWEEP ...] [--probes DIR]`: with sweeps, a sentence per
    not-learned row of their capacity and long-range tables; without, every probe."""
    parser = argparse.ArgumentParser(
        prog="python -m analysis.not_learned", description=main.__doc__
    )
    parser.add_argument("paths", nargs="*", help="sweep dirs or results files of the rows")
    parser.add_argument("--probes", default=str(coverage.SNAPSHOT), help="the probes' records")
    args = parser.parse_args(argv)
    probes = coverage.probe_records(snapshot=Path(args.probes))
    if not args.paths:
        table = coverage.probe_table(probes)
        print(table.markdown() if table else f"no probe records in {args.probes}")
        return
    frame = load_results(args.paths)
    jobs = coverage.probe_jobs(probes)
    lines = []
    records = capacity.capacity_records(frame)
    if len(records):
        lines += coverage.sentences(records, [ATTENTION, "head_dim"], jobs)
    trained = series.trained_quality(frame)
    lengths = trained[trained["task"] != "recall"] if "task" in trained else trained  # capacity's
    if len(lengths) and lengths[SEQ_LEN].nunique() > 1:
        lines += coverage.sentences(accuracy.with_learned(lengths), [ATTENTION], jobs)
    print("\n".join(f"- {line}" for line in lines) or "no row of these records is not learned")


if __name__ == "__main__":
    main()
