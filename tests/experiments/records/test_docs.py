"""docs/measurements.md against the record schema: its generated table of every column is the
schema's, and its hand-written part says how each measured column is taken (the page once said
it covered every column and lacked a dozen)."""

from __future__ import annotations

import re

from experiments.records import docs
from experiments.records.record import SCHEMA


def test_the_table_of_every_column_is_the_schemas():
    page = docs.PAGE.read_text()
    assert docs.with_table(page) == page, "run: python -m experiments.records.docs"
    assert docs.main(["--check"]) == 0


def test_every_column_but_the_configs_is_named_where_the_page_says_how_it_is_taken():
    written = docs.PAGE.read_text().partition(docs.BEGIN)[0]
    named = set(re.findall(r"`([^`]+)`", written))
    missing = [c.name for c in SCHEMA if c.part != "config" and c.name not in named]
    assert not missing, f"docs/measurements.md says nothing of {missing}"


def test_the_table_escapes_the_bars_of_a_meaning():
    (row,) = [line for line in docs.columns_table().splitlines() if line.startswith("| `dtype`")]
    assert len(re.split(r"(?<!\\)\|", row)) == 7 and "float32 \\| bfloat16" in row
