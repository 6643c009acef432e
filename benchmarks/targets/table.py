"""A row of the target table, the bounds it is judged by, and the table printed and written
as CSV."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Target:
    """One row of the table: what was measured, its value and the bound it must meet."""

    name: str
    value: float
    bound: str
    met: bool | None  # None when the row is informational


def at_least(name: str, value: float, bound: float) -> Target:
    return Target(name, value, f">= {bound:g}", value >= bound)


def at_most(name: str, value: float, bound: float) -> Target:
    return Target(name, value, f"<= {bound:g}", value <= bound)


def info(name: str, value: float) -> Target:
    return Target(name, value, "", None)


def met_text(row: Target) -> str:
    """The table's `met` cell: yes, NO, or empty for an informational row."""
    return "" if row.met is None else ("yes" if row.met else "NO")


def markdown(rows: list[Target]) -> str:
    """The table as Markdown: target, measured (two decimals), bound, met."""
    width = max(len(r.name) for r in rows)
    lines = [f"| {'target'.ljust(width)} | measured | bound | met |"]
    lines.append(f"|{'-' * (width + 2)}|---------:|-------|-----|")
    for r in rows:
        lines.append(f"| {r.name.ljust(width)} | {r.value:8.2f} | {r.bound} | {met_text(r)} |")
    return "\n".join(lines)


def print_table(rows: list[Target]) -> None:
    print("\n" + markdown(rows))


def write_csv(path: Path, rows: list[Target], run: Mapping[str, object]) -> None:
    """The table at `path` as CSV: target, measured (unrounded), bound, met as printed, then
    the `run`'s columns (its shape and threads), the same on every row."""
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["target", "measured", "bound", "met", *run])
        for r in rows:
            writer.writerow([r.name, r.value, r.bound, met_text(r), *run.values()])


MET = {"yes": True, "NO": False, "": None}


def read_csv(path: Path) -> tuple[list[Target], dict[str, str]]:
    """The rows of a table `write_csv` wrote, and its run's columns (as text)."""
    with open(path, newline="") as file:
        lines = list(csv.DictReader(file))
    if not lines:
        raise ValueError(f"{path} holds no target rows")
    rows = [Target(x["target"], float(x["measured"]), x["bound"], MET[x["met"]]) for x in lines]
    run = {k: v for k, v in lines[0].items() if k not in ("target", "measured", "bound", "met")}
    return rows, run
