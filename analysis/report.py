"""The report command: results -> every figure (PNG and SVG) and report.md in one directory.

    python -m analysis.report multirun/scaling [multirun/depth ...] --out report/
    python -m analysis.report --wandb ENTITY/PROJECT --group scaling --out report/

RESULTS are sweep dirs or results files (analysis.load). The report is its SECTIONS in order
(analysis.section: each section's tables and figures, declared by the module that builds them);
the notebooks in analysis/notebooks/ call the same functions. A figure these results
cannot fill (e.g. depth when depth was not swept) is left out and named, with the reason, under
"Not drawn"; records that could not be read are listed in report.md and on stderr. Mistakes
(no results, no W&B login, an --out that cannot be written) print one `error:` line and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd

from analysis import (
    approximation_error,
    capacity,
    decode_report,
    figures,
    flop_rate,
    frontier,
    head_dims,
    headline,
    hybrid,
    kernel_time,
    load,
    measured,
    peak_memory,
    published,
    suites,
    tradeoff,
    trained_quality,
    training_curves,
)
from analysis.markdown_table import Table
from analysis.section import COST, DECODE, QUALITY, FigureSpec, Section, TableSpec
from experiments.records.store import Unreadable

# The sections of the modules that hold their tables alone and are left as other work has them
# (their tables' functions are named elsewhere): declared here instead of in the module.
SUITES = Section(
    "MAD and ListOps",
    tables=(TableSpec(suites.mad_table, QUALITY), TableSpec(suites.listops_table, QUALITY)),
)
PUBLISHED = Section("Published results", tables=(TableSpec(published.published, QUALITY),))
HYBRID = Section("Hybrid stacks", tables=(TableSpec(hybrid.hybrid_table),))

# The report's sections, in the order of its figures: cost (kernel time and its head-dim
# tables, memory), what was not measured, accuracy (approximation error, training curves,
# trained quality, capacity, recall against state), the suites and published results, the
# trade-off, the FLOP rate, decoding, hybrid stacks.
SECTIONS: tuple[Section, ...] = (
    kernel_time.SECTION,
    head_dims.SECTION,
    peak_memory.SECTION,
    measured.SECTION,
    approximation_error.SECTION,
    training_curves.SECTION,
    trained_quality.SECTION,
    capacity.SECTION,
    frontier.SECTION,
    SUITES,
    PUBLISHED,
    tradeoff.SECTION,
    flop_rate.SECTION,
    decode_report.SECTION,
    HYBRID,
)


def _moved(sections: tuple[Section, ...], section: Section, after: Section) -> tuple[Section, ...]:
    """`sections` with `section` taken out and put back right after `after`."""
    rest = [s for s in sections if s is not section]
    at = rest.index(after) + 1
    return (*rest[:at], section, *rest[at:])


# The order of its tables (report.md lists every table, then every figure): SECTIONS', but the
# knob table (approximation error) after the published results, where report.md has it.
TABLE_ORDER: tuple[Section, ...] = _moved(SECTIONS, approximation_error.SECTION, after=PUBLISHED)

# Every figure by name, in the report's order; a figure is left out of the report when its
# `when` says these results cannot fill it, or when it drew nothing.
FIGURES: dict[str, FigureSpec] = {
    name: spec for section in SECTIONS for name, spec in section.figures.items()
}
# Each builder: frame -> Table, or None when these results hold nothing for it.
TABLES: list[Callable[[pd.DataFrame], Table | None]] = [
    spec.build for section in TABLE_ORDER for spec in section.tables
]
# Which frame each table builder reads (`section.COST`, `QUALITY`, `DECODE`).
READS: dict[Callable[[pd.DataFrame], Table | None], str] = {
    spec.build: spec.reads for section in SECTIONS for spec in section.tables
}

FORMATS = ("png", "svg")
PNG_DPI = 120


def build_report(
    frame: pd.DataFrame,
    out_dir: str | Path,
    *,
    quality: pd.DataFrame | None = None,
    decode: pd.DataFrame | None = None,
    sources: Iterable[str] = (),
    unreadable: Sequence[Unreadable] = (),
    notes: Sequence[str] = (),
) -> dict[str, Path]:
    """Write the figures that have something to show (PNG and SVG) and report.md into
    `out_dir`; the PNG path per figure written. A figure left out has no files (an old one of
    that name is removed) and is named with its reason in report.md. `quality`: records of
    trained quality from another sweep, for the tables and figures that read `QUALITY` and the
    headline; `decode`: records of decoding from another sweep, for those that read `DECODE`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs, left_out = {}, {}
    for name, spec in FIGURES.items():
        frame_of = _frame_for(spec.reads, frame, quality, decode)
        why_not = not_applicable(name, frame_of)
        if why_not is not None:
            left_out[name] = why_not
            for fmt in FORMATS:
                (out_dir / f"{name}.{fmt}").unlink(missing_ok=True)
            continue
        figure = spec.draw(frame_of)
        reason = figures.nothing_drawn(figure)
        for fmt in FORMATS:
            path = out_dir / f"{name}.{fmt}"
            if reason is None:
                figure.savefig(path, dpi=PNG_DPI if fmt == "png" else "figure")
            else:
                path.unlink(missing_ok=True)
        if reason is None:
            pngs[name] = out_dir / f"{name}.png"
        else:
            left_out[name] = reason
    text = markdown(
        frame,
        quality=quality,
        decode=decode,
        sources=sources,
        unreadable=unreadable,
        notes=notes,
        left_out=left_out,
    )
    (out_dir / "report.md").write_text(text)
    return pngs


def _frame_for(
    reads: str,
    frame: pd.DataFrame,
    quality: pd.DataFrame | None,
    decode: pd.DataFrame | None,
) -> pd.DataFrame:
    """The frame a table or figure that `reads` it is built from: `quality` or `decode` when
    given, else the main `frame`."""
    if reads == DECODE and decode is not None:
        return decode
    return quality if reads == QUALITY and quality is not None else frame


def not_applicable(name: str, frame: pd.DataFrame) -> str | None:
    """Why these results cannot fill figure `name` (its `when` condition), or None."""
    spec = FIGURES.get(name)
    return None if spec is None or spec.when is None else spec.when(frame)


def drawn_figures(frame: pd.DataFrame) -> dict[str, FigureSpec]:
    """The FIGURES whose `when` condition these results meet."""
    return {name: spec for name, spec in FIGURES.items() if not_applicable(name, frame) is None}


def markdown(
    frame: pd.DataFrame,
    *,
    quality: pd.DataFrame | None = None,
    decode: pd.DataFrame | None = None,
    sources: Iterable[str] = (),
    unreadable: Sequence[Unreadable] = (),
    notes: Sequence[str] = (),
    left_out: dict[str, str] | None = None,
) -> str:
    """report.md: the headline, provenance, unreadable records, every table that has data, then
    every figure with its caption, and the figures left out (`left_out`: name -> why; by default
    those whose `when` condition fails) with their reasons."""
    both = pd.concat([f for f in (frame, quality, decode) if f is not None], ignore_index=True)
    sources = list(sources) or sorted(set(both["source"].dropna()))
    if left_out is None:
        left_out = {
            n: r
            for n, s in FIGURES.items()
            if (r := not_applicable(n, _frame_for(s.reads, frame, quality, decode))) is not None
        }
    parts = [
        "# attnbench report",
        "",
        *headline.headline(frame, quality),
        *decode_headline(frame if decode is None else decode),
        f"Results: {', '.join(f'`{s}`' for s in sources) or 'unknown'}",
        "",
        *measured.provenance(both),
        "",
    ]
    if unreadable:
        parts += [
            "## Unreadable records",
            "",
            f"{len(unreadable)} result.json file(s) could not be read and are not in this "
            "report; re-running their sweep measures those configurations again.",
            "",
            *(f"- `{bad.path}`: {bad.reason}" for bad in unreadable),
            "",
        ]
    if notes:  # which record of a configuration is shown (`load.record_notes`)
        parts += ["## Records shown", "", *(f"- {note}" for note in notes), ""]
    parts += [markdown_tables(frame, quality=quality, decode=decode), "## Figures", ""]
    for name, spec in FIGURES.items():
        if name in left_out:
            continue
        parts += [
            f"### {name}",
            "",
            f"![{name}]({name}.png)",
            "",
            f"{spec.caption} ([SVG]({name}.svg))",
            "",
        ]
    if left_out:
        parts += ["### Not drawn", ""]
        parts += [f"- {name}: {reason}" for name, reason in left_out.items()]
        parts += [""]
    return "\n".join(parts)


def markdown_tables(
    frame: pd.DataFrame,
    builders: Iterable[Callable[[pd.DataFrame], Table | None]] = TABLES,
    *,
    quality: pd.DataFrame | None = None,
    decode: pd.DataFrame | None = None,
) -> str:
    """The Markdown of every table among `builders` that these results fill (each from the
    frame it `READS`: `quality` or `decode` when given)."""
    built = (
        builder(_frame_for(READS.get(builder, COST), frame, quality, decode))
        for builder in builders
    )
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
        "--wandb",
        metavar="ENTITY/PROJECT",
        help="read the job runs of a W&B project online (needs a login)",
    )
    parser.add_argument("--group", help="with --wandb: the W&B group (the sweep's name)")
    parser.add_argument(
        "--quality",
        nargs="+",
        metavar="RESULTS",
        help="records of trained quality from other sweeps (e.g. a long-range run) for the "
        "accuracy figures and tables and the headline; RESULTS then give time and memory",
    )
    parser.add_argument(
        "--decode",
        nargs="+",
        metavar="RESULTS",
        help="records of decoding (measure.decode) from other sweeps for the decode figure, "
        "table and headline",
    )
    args = parser.parse_args(argv)
    if not args.results and not args.wandb:
        parser.error("give RESULTS or --wandb ENTITY/PROJECT")
    try:
        frame, sources, unreadable = _load(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for bad in unreadable:
        print(f"warning: unreadable record {bad.path}: {bad.reason}", file=sys.stderr)
    notes = load.record_notes(args.results)
    for note in notes:
        print(note, file=sys.stderr)
    if frame.empty:
        print(f"error: no readable records in {', '.join(sources)}", file=sys.stderr)
        return 1
    extra = {}  # the other sweeps a report draws parts from: --quality, --decode
    for option in ("quality", "decode"):
        paths = getattr(args, option)
        if not paths:
            extra[option] = None
            continue
        try:
            extra[option] = load.tidy(load.load_results(paths))
        except (FileNotFoundError, ValueError) as error:
            print(f"error: --{option}: {error}", file=sys.stderr)
            return 1
        sources += paths
        unreadable += load.unreadable_records(paths)
    quality, decode_frame = extra["quality"], extra["decode"]
    try:
        pngs = build_report(
            frame,
            args.out,
            quality=quality,
            decode=decode_frame,
            sources=sources,
            unreadable=unreadable,
            notes=notes,
        )
    except OSError as error:  # a read-only or full --out: one line, not a traceback
        where = f": {error.filename}" if error.filename else ""
        print(f"error: --out {args.out}: {error.strerror or error}{where}", file=sys.stderr)
        return 1
    summary = kernel_time.variant_summary(frame)
    if summary is not None:
        print(summary.markdown())
    warned = measured.timing_warnings(frame)
    if warned is not None:
        print(f"warning: {len(warned.frame)} timing warning(s): see report.md", file=sys.stderr)
    print(f"report: {args.out / 'report.md'} ({len(frame)} records, {len(pngs)} figures)")
    return 0


decode_headline = decode_report.headline


def _load(args: argparse.Namespace) -> tuple[pd.DataFrame, list[str], list[Unreadable]]:
    """The records the arguments name, their sources, and the records that could not be read.

    Raises FileNotFoundError (no results there) or ValueError (not a results file, no W&B
    login) with a one-line message.
    """
    frames, sources = [], [*args.results]
    if args.results:
        frames.append(load.load_results(args.results))
    if args.wandb:
        frames.append(_load_wandb(args.wandb, args.group))
        sources.append(f"wandb:{args.wandb}" + (f" group {args.group}" if args.group else ""))
    unreadable = load.unreadable_records(args.results)
    return load.tidy(pd.concat(frames, ignore_index=True)), sources, unreadable


def _load_wandb(project: str, group: str | None) -> pd.DataFrame:
    """`load.load_wandb`, with a failure to reach W&B (no login, no network) as a ValueError."""
    try:
        return load.load_wandb(project, group)
    except FileNotFoundError:
        raise
    except Exception as error:  # wandb raises its own errors (UsageError, CommError, ...)
        text = " ".join(str(error).split())
        raise ValueError(
            f"cannot read W&B project {project!r} ({type(error).__name__}: {text}); "
            "run `wandb login` first, or set WANDB_API_KEY"
        ) from error


if __name__ == "__main__":
    sys.exit(main())
