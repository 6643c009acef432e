"""experiments/ as sub-packages with one job each, and the floors between them: what each part
imports, read from the source (every import, at the top or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repo


def imports(folder: str) -> dict[str, set[str]]:
    """file (relative to the repo) -> every module it imports, as full dotted names, for every
    file under `folder` (or the one file `folder` names)."""
    found = {}
    paths = [ROOT / folder] if folder.endswith(".py") else (ROOT / folder).glob("**/*.py")
    for path in sorted(paths):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        found[str(path.relative_to(ROOT))] = names
    return found


def of(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


@pytest.mark.parametrize("package", ["app", "measurement", "records", "training"])
def test_every_sub_package_exists_and_the_flat_modules_are_gone(package):
    assert (ROOT / "experiments" / package / "__init__.py").is_file()
    flat = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
    assert flat == ["__init__.py", "config.py", "run.py"]


def test_analysis_reads_only_the_records_of_experiments():
    for path, names in imports("analysis").items():
        others = {n for n in of(names, "experiments") if not n.startswith("experiments.records")}
        assert not others, f"{path} imports {sorted(others)}"


def test_the_records_import_nothing_above_them():
    for path, names in imports("experiments/records").items():
        others = {n for n in of(names, "experiments") if not n.startswith("experiments.records")}
        assert not others and not of(names, "analysis"), f"{path} imports {sorted(others)}"


def test_measurement_knows_nothing_of_the_app_or_analysis():
    for path, names in imports("experiments/measurement").items():
        above = of(names, "experiments.app") | of(names, "experiments.run")
        assert not above and not of(names, "analysis"), f"{path} imports {sorted(above)}"


def test_the_config_imports_only_the_floors_below_it():
    (names,) = imports("experiments/config.py").values()
    above = of(names, "experiments.app") | of(names, "experiments.measurement")
    above |= of(names, "experiments.run")
    assert not above and not of(names, "analysis"), f"experiments/config.py imports {sorted(above)}"


def test_training_knows_nothing_of_measuring_the_app_or_analysis():
    for path, names in imports("experiments/training").items():
        above = of(names, "experiments.app") | of(names, "experiments.measurement")
        above |= of(names, "experiments.run") | of(names, "experiments.config")
        assert not above and not of(names, "analysis"), f"{path} imports {sorted(above)}"


def test_the_one_import_of_analysis_is_the_end_of_a_sweep():
    importers = [p for p, names in imports("experiments").items() if of(names, "analysis")]
    assert importers == ["experiments/app/sweep.py"]
