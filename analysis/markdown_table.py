"""report.md's tables as Markdown: `Table` and the cell helpers every table shares.

Each builder takes the results frame and returns a `Table`, or None when the results hold
nothing for it (so a report shows only the tables its sweep can fill). The builders live in the
report's sections, with the figures of their topic (`analysis.report.SECTIONS`).

A row of configurations starts with `variant` and one column per key that varies in the
results (`series.key_values`: the attention's varying options, then block, depth, threads, ...),
so what was swept is always visible; a column with nothing to say (no fit, no reference, not
measured) is left out rather than filled with dashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from analysis import series
from analysis.load import format_value

EMPTY = ("", "—", "n/a")  # cells that say nothing


@dataclass(frozen=True)
class Table:
    """A titled table with an explanatory note, rendered as GitHub-flavoured Markdown."""

    title: str
    frame: pd.DataFrame
    note: str = ""

    def markdown(self) -> str:
        header = "| " + " | ".join(_cell(c) for c in self.frame.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.frame.columns) + "|"
        body = [
            "| " + " | ".join(_cell(v) for v in row) + " |"
            for row in self.frame.itertuples(index=False)
        ]
        note = f"\n{self.note}\n" if self.note else ""
        return "\n".join([f"## {self.title}", "", header, rule, *body, note])


def with_keys(rows: list[dict], labelled: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`rows` (each with its `series` label) with the label replaced by the series' key
    columns (`series.key_values`): variant, then each key that varies."""
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    described = series.key_values(labelled, keys).loc[table["series"]].reset_index(drop=True)
    return pd.concat([described, table.drop(columns="series")], axis=1)


def informative(table: pd.DataFrame, also_empty: Sequence[str] = ()) -> pd.DataFrame:
    """`table` without the columns whose every cell says nothing (blank, —, n/a, `also_empty`)."""
    empty = (*EMPTY, *also_empty)
    return table[[c for c in table if not table[c].map(lambda v: str(v) in empty).all()]]


def format_length(value) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{float(value):,.0f}"


def distinct(column: pd.Series) -> str:
    values = [format_value(v) for v in column.dropna().unique()]
    return ", ".join(values) if values else "unknown"


def _cell(value) -> str:
    text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")
