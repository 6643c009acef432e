"""The huge-page allocation is on before torch starts in the entry points, unless the user's
environment says no; importing the package sets nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from experiments.measurement import allocator
from tests.experiments.conftest import ROOT

# Prints THP_MEM_ALLOC_ENABLE as it was when `import torch` began, in a process that imports
# only MODULE, then does what it does before measuring (THEN): what c10's allocator, which reads
# the variable at its first allocation, can see. The process ends right there: the rest of
# torch's import (seconds) cannot change what it saw.
WATCH_TORCH_IMPORT = """
import importlib.abc, os, sys
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print(os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"), flush=True)
            os._exit(0)
sys.meta_path.insert(0, Watch())
import MODULE
THEN
print("torch never imported")
"""
# The app's import starts no torch (`--help` needs none): a job's measuring modules do. `python
# -m benchmarks.targets` imports the package, then runs its `__main__`, whose imports start torch.
THEN = {
    "experiments.run": "experiments.app.job.import_for_measuring()",
    "benchmarks.targets": "import benchmarks.targets.__main__",
}
CASES = {  # (module, the variable in the environment or None) -> value seen at torch's import
    ("experiments.run", None): "1",
    ("benchmarks.targets", None): "1",
    ("benchmarks.targets", "0"): "0",
}


@pytest.fixture(scope="module")
def seen_at_torch_import() -> dict[tuple[str, str | None], str]:
    """Every case in its own fresh process, all launched at once (each imports up to torch)."""
    processes = {}
    for module, value in CASES:
        env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
        if value is not None:
            env["THP_MEM_ALLOC_ENABLE"] = value
        script = WATCH_TORCH_IMPORT.replace("THEN", THEN[module]).replace("MODULE", module)
        processes[module, value] = subprocess.Popen(
            [sys.executable, "-c", script], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE
        )
    return {
        case: process.communicate(timeout=120)[0].strip() for case, process in processes.items()
    }


@pytest.mark.parametrize("case", CASES)
def test_the_variable_is_set_before_torch_is_imported_unless_the_user_set_it(
    seen_at_torch_import, case
):
    assert seen_at_torch_import[case] == CASES[case]


def test_once_torch_is_imported_the_variable_is_left_alone(monkeypatch):
    """The allocator may have read it already: setting it now would make records say what did
    not happen."""
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    allocator.enable_by_default()  # torch is imported in the test process
    assert "THP_MEM_ALLOC_ENABLE" not in os.environ and allocator.thp_mem_alloc() is False


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("true", False)])
def test_on_only_for_the_value_c10_takes_as_on(monkeypatch, value, on):
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", value)
    assert allocator.thp_mem_alloc() is on


# The package, each sub-package, and the modules the app and analysis import before a job
# measures (the record schema, the store, the config, the end of a sweep).
IMPORTED = (
    "experiments",
    "experiments.app",
    "experiments.measurement",
    "experiments.records",
    "experiments.training",
    "experiments.records.record",
    "experiments.records.store",
    "experiments.records.history",
    "experiments.job_config",
    "experiments.app.job",
    "experiments.app.sweep",
)


def test_importing_the_packages_changes_no_environment_variable():
    """Only the entry points set the variable; the packages, and the modules the app and
    analysis import, leave the environment as they found it."""
    script = (
        "import os; before = dict(os.environ)\n"
        f"import {', '.join(IMPORTED)}\n"
        "print(dict(os.environ) == before)"
    )
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "True", done.stderr[-1500:]
