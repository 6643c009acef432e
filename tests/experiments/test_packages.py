"""experiments/ as sub-packages with one job each, and the floors between them: what each part
imports, read from the source (every import, at the top or inside a function, relative ones
resolved, and the modules named by `importlib.import_module` and kin with a literal name).

The top-level floors, lowest first: variants <- experiments <- analysis <- benchmarks. A floor
imports only those below it; inside experiments, analysis reads only the records. No import is
delayed (into a function, or under `if TYPE_CHECKING`) to hide a cycle between the project's
modules: the piece both sides need moves below them.
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


def statement_imports(source: str, module: str, *, package: bool = False):
    """Per import statement of `module`'s source, whether it is delayed (inside a function or
    under `if TYPE_CHECKING`: an import a cycle can hide behind) and the modules it names (as
    `module_imports` names them)."""
    found = []

    def visit(node: ast.AST, delayed: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = delayed or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inside = True
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = module_imports(ast.unparse(child), module, package=package)
                found.append((inside, names))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def delayed_imports(source: str, module: str, *, package: bool = False) -> set[str]:
    """The modules `module` imports inside a function or under `if TYPE_CHECKING`."""
    rows = statement_imports(source, module, package=package)
    return {name for delayed, names in rows if delayed for name in names}


def project_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """module -> the project modules it imports (every import statement), and module -> those
    it imports delayed. A name resolves to the longest dotted prefix that is a project module;
    `from pkg import sub` of a module `sub` imports pkg only as its parent, as any import of a
    submodule does, and is not counted as an import of pkg."""
    sources = {}
    for floor in FLOORS:
        for path in sorted((ROOT / floor).glob("**/*.py")):
            package = path.name == "__init__.py"
            parts = path.relative_to(ROOT).with_suffix("").parts
            sources[".".join(parts[:-1] if package else parts)] = (path.read_text(), package)

    def resolve(names: set[str], module: str) -> set[str]:
        parents = {n.rsplit(".", 1)[0] for n in names if n in sources and "." in n}
        found = set()
        for name in names - parents:
            parts = name.split(".")
            prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
            home = next((p for p in prefixes if p in sources), None)
            if home is not None and home != module:
                found.add(home)
        return found

    every, delayed = {}, {}
    for module, (source, package) in sources.items():
        every[module], delayed[module] = set(), set()
        for later, names in statement_imports(source, module, package=package):
            targets = resolve(names, module)
            every[module] |= targets
            if later:
                delayed[module] |= targets
    return every, delayed


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def hidden_cycles(every: dict[str, set[str]], delayed: dict[str, set[str]]) -> list[str]:
    """Each delayed import A -> B where B imports A back, directly or through others."""
    return sorted(
        f"{a} -> {b}" for a, targets in delayed.items() for b in targets if reaches(every, b, a)
    )


def test_no_delayed_import_hides_a_cycle_between_the_projects_modules():
    """model <-> generation, model <-> hf, analysis.series <-> analysis.tuning and the combined
    plan <-> layer once imported each other, one side in a function or under TYPE_CHECKING;
    the shared pieces moved below both (variants/positions.py, analysis/context.py, the plan
    built from plain values)."""
    cycles = hidden_cycles(*project_graph())
    assert cycles == [], f"delayed imports that hide a cycle: {cycles}"


def test_the_cycle_reader_sees_imports_in_functions_and_under_type_checking():
    source = """
from typing import TYPE_CHECKING
import variants.checks
if TYPE_CHECKING:
    from variants.attention.combined.layer import CombinedAttention
def step():
    from variants.model import sinusoidal_positions
"""
    names = delayed_imports(source, "variants.generation")
    assert "variants.attention.combined.layer" in names and "variants.model" in names
    assert "variants.checks" not in names
    every = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert hidden_cycles(every, {"c": {"a"}, "d": {"a"}}) == ["c -> a"]
