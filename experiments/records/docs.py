"""docs/measurements.md's table of every column, generated from the record schema (record.py).

    python -m experiments.records.docs           rewrite the table in docs/measurements.md
    python -m experiments.records.docs --check   exit 1 if it is not the schema's

The table sits between `BEGIN` and `END` in the page; the rest of the page (how each measured
column is taken) is written by hand. tests/experiments/records/test_docs.py checks both that the
table is current and that every column is named in the page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.records.record import SCHEMA, Column

PAGE = Path(__file__).resolve().parents[2] / "docs" / "measurements.md"
BEGIN = (
    "<!-- columns: generated from experiments/records/record.py by "
    "`python -m experiments.records.docs` -->"
)
END = "<!-- end of the generated columns -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(column: Column) -> str:
    cells = [f"`{column.name}`", column.part, column.type.__name__, column.unit, column.doc]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def columns_table() -> str:
    """Every schema column, in the schema's order: name, part, type, unit, meaning."""
    lines = ["| column | part | type | unit | meaning |", "|---|---|---|---|---|"]
    return "\n".join([*lines, *map(_row, SCHEMA)])


def with_table(page: str) -> str:
    """`page` with the text between `BEGIN` and `END` replaced by `columns_table()`."""
    head, found, rest = page.partition(BEGIN)
    if not found or END not in rest:
        raise ValueError(f"{PAGE}: no {BEGIN!r} ... {END!r} block for the columns table")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{columns_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    current = with_table(page)
    if args.check:
        if current != page:
            print(f"{PAGE}: the columns table is stale; run python -m experiments.records.docs")
            return 1
        return 0
    PAGE.write_text(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
