"""A section of report.md: the tables and figures of one topic, declared once, as `SECTION`, by
the module that builds them; `analysis.report.SECTIONS` puts the sections in the report's order.

A table builder takes a results frame and returns a `Table`, or None when the results hold
nothing for it. A figure function takes a results frame and returns a Figure; it is drawn only
when its `when` (frame -> why not, or None) lets it and it drew something (`style.nothing_drawn`).
`reads` says which of the report's frames a table or figure is built from: the cost records, or
the `quality=` / `decode=` records when the report is given them (`analysis.report.build_report`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd
from matplotlib.figure import Figure

from analysis.markdown_table import Table

COST = "cost"  # the report's main frame: what every table and figure reads by default
QUALITY = "quality"  # `quality=`: trained quality from another sweep (else the main frame)
DECODE = "decode"  # `decode=`: decoding from another sweep (else the main frame)


@dataclass(frozen=True)
class TableSpec:
    """One table of a section: its builder and the frame it reads."""

    build: Callable[[pd.DataFrame], Table | None]
    reads: str = COST


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a section: its function, its caption in report.md, when it is drawn
    (frame -> why these results cannot fill it, or None; no condition: always) and the frame
    it reads."""

    draw: Callable[[pd.DataFrame], Figure]
    caption: str
    when: Callable[[pd.DataFrame], str | None] | None = None
    reads: str = COST


@dataclass(frozen=True, eq=False)
class Section:
    """A topic of the report: its title (for readers of the code and docs; report.md prints
    the tables' own titles), its tables in order, and its figures (name -> spec) in order."""

    title: str
    tables: tuple[TableSpec, ...] = ()
    figures: Mapping[str, FigureSpec] = field(default_factory=dict)
