"""Every notebook (jupytext percent .py) executes against the fixture sweep, figures inline."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest

FIGURE_CALL = re.compile(r"[a-z_]+\.[a-z_]+\(frame\b")
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "analysis" / "notebooks").glob("*.py"))


def with_parameters(notebook: nbformat.NotebookNode, **values) -> nbformat.NotebookNode:
    """Insert a cell after the one tagged `parameters` that overrides it (papermill's way)."""
    index = next(
        i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])
    )
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    return notebook


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"scaling", "depth", "ablations"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_fixture(path, small_sweep, tmp_path, monkeypatch):
    # Kernel specs and connection files from tmp and the venv only: the "python3" kernel is
    # then ipykernel's own, which jupyter_client starts with this interpreter (sys.executable).
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter_data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter_runtime"))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    notebook = with_parameters(jupytext.read(path), RESULTS=[str(small_sweep)])
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    figure_cells = [  # a section's figure function called on the frame: `module.figure(frame...)`
        c for c in notebook.cells if c.cell_type == "code" and FIGURE_CALL.match(c.source)
    ]
    assert len(figures) == len(figure_cells) > 0
