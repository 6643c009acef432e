"""The command shape of a report section run alone: `python -m analysis.<section> PATH...`
loads sweep dirs or results files and prints the section's tables as Markdown."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import pandas as pd

from analysis.load import load_results
from analysis.markdown_table import Table


def print_tables(
    prog: str,
    description: str | None,
    builders: Sequence[Callable[[pd.DataFrame], Table | None]],
    nothing: str,
    argv: list[str] | None = None,
) -> None:
    """Parse `argv` (paths: sweep dirs or results files), load them and print each builder's
    table that is not None, or `nothing` when none is."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("paths", nargs="+", help="sweep dirs or results files")
    try:
        frame = load_results(parser.parse_args(argv).paths)
    except (FileNotFoundError, ValueError) as error:  # a path holding no results: one line
        parser.error(str(error))
    tables = [t for t in (build(frame) for build in builders) if t is not None]
    print("\n\n".join(t.markdown() for t in tables) or nothing)
