"""The report command: results -> every figure (PNG and SVG) and report.md in one directory.

    python -m analysis.report multirun/scaling [multirun/depth ...] --out report/
    python -m analysis.report multirun/scaling --offline-runs --out report/   # from W&B files
    python -m analysis.report --wandb ENTITY/PROJECT --group scaling --out report/

RESULTS are sweep dirs or results files (analysis.load). The same figures come from the
notebooks in analysis/notebooks/, which call the functions listed here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis import load, plots, series, tables

# name -> (figure function, caption). Every figure is always written, except those in WHEN whose
# condition these results do not meet; a figure with nothing to draw says so in its panel.
FIGURES: dict[str, tuple[Callable[[pd.DataFrame], Figure], str]] = {
    "time_vs_seq_len": (
        plots.time_vs_seq_len,
        "Kernel time against sequence length (log-log), forward and "
        "forward+backward; legend: fitted exponent α and crossover L* against "
        "exact attention (star).",
    ),
    "memory_vs_seq_len": (
        plots.memory_vs_seq_len,
        "Peak memory of one training step against sequence length (log-log).",
    ),
    "depth": (plots.depth, "Peak memory and step time against depth per block type."),
    "error_vs_seq_len": (
        plots.error_vs_seq_len,
        "Relative approximation error against exact attention vs sequence length.",
    ),
    "error_vs_knob": (plots.error_vs_knob, "Approximation error against each variant's knob."),
    "training_curves": (
        plots.training_curves,
        "Training and eval loss per step (from the W&B runs) and final losses.",
    ),
    "accuracy_vs_seq_len": (
        plots.accuracy_vs_seq_len,
        "Trained accuracy against sequence length per variant: mean over seeds, band min–max; "
        "dotted: the 90 % exact attention must reach for the setup to measure anything.",
    ),
    "tradeoff": (
        plots.tradeoff,
        "Quality against the kernel's forward+backward time at the longest length with both "
        "(trained accuracy, else the error on trained activations; never random-token loss); "
        "marker area is a training step's peak memory.",
    ),
    "flops_fraction": (
        plots.flops_fraction,
        "Achieved useful GFLOP/s of the kernel as a fraction of the measured matmul rate.",
    ),
}

# Figures drawn only when the results hold what they show.
WHEN: dict[str, Callable[[pd.DataFrame], bool]] = {
    "accuracy_vs_seq_len": lambda frame: series.trained_quality(frame)["seq_len"].nunique() > 1,
    "tradeoff": lambda frame: plots.tradeoff_quality(frame) is not None,
}

# Each builder: frame -> Table, or None when these results hold nothing for it.
TABLES: list[Callable[[pd.DataFrame], tables.Table | None]] = [
    tables.variant_summary,
    tables.depth_table,
    tables.failures,
    tables.cross_evaluation,
    tables.quality,
    tables.quality_by_length,
    tables.error_by_knob,
]

FORMATS = ("png", "svg")
PNG_DPI = 120


def build_report(
    frame: pd.DataFrame, out_dir: str | Path, *, sources: Iterable[str] = ()
) -> dict[str, Path]:
    """Write every figure (PNG and SVG) and report.md into `out_dir`; the PNG path per figure."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = {}
    for name, (draw, _) in drawn_figures(frame).items():
        figure = draw(frame)
        for fmt in FORMATS:
            figure.savefig(out_dir / f"{name}.{fmt}", dpi=PNG_DPI if fmt == "png" else "figure")
        pngs[name] = out_dir / f"{name}.png"
    (out_dir / "report.md").write_text(markdown(frame, sources=sources))
    return pngs


def drawn_figures(frame: pd.DataFrame) -> dict[str, tuple[Callable[[pd.DataFrame], Figure], str]]:
    """The FIGURES these results fill (all but those whose WHEN condition fails)."""
    return {name: spec for name, spec in FIGURES.items() if WHEN.get(name, _always)(frame)}


def _always(frame: pd.DataFrame) -> bool:
    return True


def markdown(frame: pd.DataFrame, *, sources: Iterable[str] = ()) -> str:
    """report.md: provenance, every table that has data, then every figure with its caption."""
    sources = list(sources) or sorted(set(frame["source"].dropna()))
    parts = [
        "# attnbench report",
        "",
        f"Results: {', '.join(f'`{s}`' for s in sources) or 'unknown'}",
        "",
        *tables.provenance(frame),
        "",
    ]
    parts += [markdown_tables(frame), "## Figures", ""]
    for name, (_, caption) in drawn_figures(frame).items():
        parts += [
            f"### {name}",
            "",
            f"![{name}]({name}.png)",
            "",
            f"{caption} ([SVG]({name}.svg))",
            "",
        ]
    return "\n".join(parts)


def markdown_tables(
    frame: pd.DataFrame,
    builders: Iterable[Callable[[pd.DataFrame], tables.Table | None]] = TABLES,
) -> str:
    """The Markdown of every table among `builders` that these results fill."""
    built = (builder(frame) for builder in builders)
    return "\n".join(table.markdown() + "\n" for table in built if table is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "results",
        nargs="*",
        metavar="RESULTS",
        help="sweep dirs, results.csv/.parquet or result.json files",
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="directory for figures and report.md"
    )
    parser.add_argument(
        "--offline-runs",
        action="store_true",
        help="read the W&B offline runs under RESULTS instead of result.json files",
    )
    parser.add_argument(
        "--wandb",
        metavar="ENTITY/PROJECT",
        help="read the job runs of a W&B project online (needs a login)",
    )
    parser.add_argument("--group", help="with --wandb: the W&B group (the sweep's name)")
    args = parser.parse_args(argv)
    if not args.results and not args.wandb:
        parser.error("give RESULTS or --wandb ENTITY/PROJECT")
    frames, sources = [], [*args.results]
    if args.results:
        frames.append(load.load_results(args.results, offline_runs=args.offline_runs))
    if args.wandb:
        frames.append(load.load_wandb(args.wandb, args.group))
        sources.append(f"wandb:{args.wandb}" + (f" group {args.group}" if args.group else ""))
    frame = load.tidy(pd.concat(frames, ignore_index=True))
    build_report(frame, args.out, sources=sources)
    summary = tables.variant_summary(frame)
    if summary is not None:
        print(summary.markdown())
    print(f"report: {args.out / 'report.md'} ({len(frame)} records, {len(FIGURES)} figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
