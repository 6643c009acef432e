"""A row of the target table, the bounds it is judged by, and the table printed."""

from __future__ import annotations

from dataclasses import dataclass


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


def print_table(rows: list[Target]) -> None:
    width = max(len(r.name) for r in rows)
    print(f"\n| {'target'.ljust(width)} | measured | bound | met |")
    print(f"|{'-' * (width + 2)}|---------:|-------|-----|")
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "NO")
        print(f"| {r.name.ljust(width)} | {r.value:8.2f} | {r.bound} | {met} |")
