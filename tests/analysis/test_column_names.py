"""Column names in figures and tables come from the record schema: every schema column is
importable from `analysis.column_names`, nothing else is, and no figure or table module spells a
column as a string literal."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import column_names
from experiments.records.record import SCHEMA

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
# The modules that draw figures or build tables (figures/__init__.py only re-exports the kit).
FIGURE_AND_TABLE_MODULES = sorted(
    [
        *(p for p in (ANALYSIS / "figures").glob("*.py") if p.name != "__init__.py"),
        *(
            ANALYSIS / name
            for name in (
                "markdown_table.py",
                "scaling_fits.py",
                "kernel_time.py",
                "flop_rate.py",
                "trained_quality.py",
                "training_curves.py",
                "tradeoff.py",
                "peak_memory.py",
                "approximation_error.py",
                "measured.py",
                "capacity.py",
                "decode_report.py",
                "headline.py",
            )
        ),
        ANALYSIS / "glance.py",
    ]
)


def test_every_schema_column_is_a_constant_of_its_own_name():
    for column in SCHEMA:
        assert getattr(column_names, column.name.upper()) == column.name
    assert sorted(dir(column_names)) == sorted(c.name.upper() for c in SCHEMA)
    from analysis.column_names import ATTN_FWD_BWD_MS, SEQ_LEN

    assert (SEQ_LEN, ATTN_FWD_BWD_MS) == ("seq_len", "attn_fwd_bwd_ms")


def test_a_name_the_schema_does_not_hold_fails_at_import():
    with pytest.raises(ImportError, match="ATTN_FWD_BWD_SECONDS"):
        exec("from analysis.column_names import ATTN_FWD_BWD_SECONDS", {})
    with pytest.raises(AttributeError, match="seq_len_tokens"):
        column_names.SEQ_LEN_TOKENS  # noqa: B018
    with pytest.raises(AttributeError):
        column_names.seq_len  # noqa: B018 (only capitals are column constants)


def test_checked_accepts_columns_and_evaluation_columns_only():
    assert column_names.checked("eval_accuracy") == "eval_accuracy"
    assert column_names.checked("eval_accuracy@lsh") == "eval_accuracy@lsh"
    with pytest.raises(ValueError, match="'attention.n_hashes'"):
        column_names.checked("attention.n_hashes")


def test_a_renamed_column_breaks_the_report_at_import():
    # As if `seq_len` were renamed in the schema: the report's modules no longer import.
    code = (
        "import experiments.records.record as r; del r.COLUMNS['seq_len']; import analysis.report"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "'SEQ_LEN'" in done.stderr


def _column_literals(path: Path) -> list[str]:
    """String literals of `path` that are schema column names, outside docstrings, f-strings and
    the figure names of a `Section(figures={name: ...})` (a file name: the depth figure is
    `depth.png`, not the column)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Section":
            named = [k.value for k in node.keywords if k.arg == "figures"]
            skip.update(id(key) for d in named if isinstance(d, ast.Dict) for key in d.keys)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))
    names = {c.name for c in SCHEMA}
    return [
        f"{path.name}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and id(node) not in skip and node.value in names
    ]


@pytest.mark.parametrize("path", FIGURE_AND_TABLE_MODULES, ids=lambda p: p.name)
def test_figures_and_tables_take_column_names_from_the_schema(path):
    assert _column_literals(path) == []
