"""experiments/ as sub-packages with one job each, and the floors between them: what each part
imports, read from the source (every import, at the top or inside a function, relative ones
resolved, and the modules named by `importlib.import_module` and kin with a literal name).

The top-level floors, lowest first: variants <- experiments <- analysis <- benchmarks. A floor
imports only those below it; inside experiments, analysis reads only the records.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repo
FLOORS = ("variants", "experiments", "analysis", "benchmarks")  # lowest first
# Calls whose first argument, a literal, names a module to import (or an object in one).
IMPORTING_CALLS = {"import_module", "__import__", "get_method", "get_class", "get_object", "locate"}


def module_imports(source: str, module: str, *, package: bool = False) -> set[str]:
    """Every module the source of `module` (a package's `__init__` if `package`) imports, as
    full dotted names: `import` and `from ... import` anywhere in the file (in a function, under
    `if TYPE_CHECKING`), relative imports resolved, and literal names given to
    `importlib.import_module`, `__import__`, Hydra's `get_method`/`get_class`/`get_object`,
    `pydoc.locate`, or as a `"_target_"` in a dict literal."""
    parts = module.split(".") if package else module.split(".")[:-1]  # the enclosing package
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if called in IMPORTING_CALLS and isinstance(first, ast.Constant):
                if isinstance(first.value, str):
                    names.add(first.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "_target_"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    names.add(value.value)
    return names - {""}


def imports(folder: str) -> dict[str, set[str]]:
    """file (relative to the repo) -> every module it imports (`module_imports`), for every
    file under `folder` (or the one file `folder` names)."""
    found = {}
    paths = [ROOT / folder] if folder.endswith(".py") else (ROOT / folder).glob("**/*.py")
    for path in sorted(paths):
        relative = path.relative_to(ROOT)
        package = path.name == "__init__.py"
        dotted = ".".join(relative.with_suffix("").parts[: -1 if package else None])
        found[str(relative)] = module_imports(path.read_text(), dotted, package=package)
    return found


def of(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


@pytest.mark.parametrize("package", ["app", "measurement", "records", "training"])
def test_every_sub_package_exists_and_the_flat_modules_are_gone(package):
    assert (ROOT / "experiments" / package / "__init__.py").is_file()
    flat = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
    assert flat == ["__init__.py", "job_config.py", "run.py"]


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
    (names,) = imports("experiments/job_config.py").values()
    above = of(names, "experiments.app") | of(names, "experiments.measurement")
    above |= of(names, "experiments.run")
    assert not above and not of(names, "analysis"), f"job_config.py imports {sorted(above)}"


def test_training_knows_nothing_of_measuring_the_app_or_analysis():
    for path, names in imports("experiments/training").items():
        above = of(names, "experiments.app") | of(names, "experiments.measurement")
        above |= of(names, "experiments.run") | of(names, "experiments.job_config")
        assert not above and not of(names, "analysis"), f"{path} imports {sorted(above)}"


@pytest.mark.parametrize("floor", FLOORS)
def test_no_floor_imports_one_above_it(floor):
    """experiments/app/sweep.py once imported analysis inside a function (the end-of-sweep
    report), a loop with analysis reading experiments.records that the delayed import hid;
    conf/config.yaml now names the report step, and no module of a floor imports a floor above
    it, at the top or not."""
    above = FLOORS[FLOORS.index(floor) + 1 :]
    for path, names in imports(floor).items():
        upward = sorted(n for package in above for n in of(names, package))
        assert not upward, f"{path} imports {upward}, a floor above {floor}"


def test_the_import_reader_sees_delayed_relative_and_named_imports():
    source = """
import os
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from analysis import load
def report():
    from analysis import sweep_report
    import analysis.tables
    from . import store
    from ..training import train
    importlib.import_module("analysis.figures")
    hydra.utils.get_method("analysis.report.build_report")
    return {"_target_": "analysis.headline.Thing"}
"""
    names = module_imports(source, "experiments.app.sweep")
    assert {
        "os",
        "analysis",
        "analysis.load",
        "analysis.sweep_report",
        "analysis.tables",
        "experiments.app.store",
        "experiments.training.train",
        "analysis.figures",
        "analysis.report.build_report",
        "analysis.headline.Thing",
    } <= names
    in_package = module_imports("from . import record", "experiments.records", package=True)
    assert in_package == {"experiments.records", "experiments.records.record"}
