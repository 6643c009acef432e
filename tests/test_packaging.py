"""The installed project: every package, and the configs, travel with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def tree_packages() -> list[str]:
    """Every directory of the top-level packages that holds Python files, dotted."""
    found = []
    for top in ("variants", "experiments", "analysis", "benchmarks"):
        for folder in [ROOT / top, *sorted((ROOT / top).rglob("*"))]:
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                found.append(".".join(folder.relative_to(ROOT).parts))
    return sorted(found)


def test_pyproject_lists_every_package_of_the_tree():
    listed = [p for p in SETUPTOOLS["packages"] if p != "experiments.conf"]
    assert sorted(listed) == tree_packages(), "add the new package to pyproject's list"
    assert SETUPTOOLS["package-dir"] == {"experiments.conf": "conf"}


@pytest.mark.slow
def test_installed_attnbench_finds_its_configs_from_any_directory(tmp_path):
    """A regular (non-editable) install into a fresh venv, run from an unrelated directory.

    Its dependencies come from this environment (a .pth line to its site-packages), so nothing
    is downloaded; the project is built from a copy, as an in-tree build writes build/ there.
    """
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".*", "__pycache__", "*.egg-info", "build", "multirun", "outputs", "tests", "report"
        ),
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "_attnbench_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps"]
        + ["--no-build-isolation", "--no-index", source],
        check=True,
        capture_output=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    commands = {
        "attnbench": [env_dir / "bin" / "attnbench"],
        "python -m": [python, "-m", "experiments.run"],
    }
    runs = {
        name: subprocess.Popen(
            [*command, "--cfg", "job", "attention=lsh"],
            cwd=elsewhere,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, command in commands.items()
    }
    outputs = {name: run.communicate(timeout=300) for name, run in runs.items()}
    for name, run in runs.items():
        assert run.returncode == 0, (name, outputs[name][1][-2000:])
    assert outputs["attnbench"][0] == outputs["python -m"][0]
    assert "  name: lsh\n" in outputs["attnbench"][0]
    where = subprocess.run(  # importing the package, not torch: quick
        [
            python,
            "-c",
            "import importlib.util; print(importlib.util.find_spec('experiments').origin)",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), where  # the installed copy, not this checkout
    assert (Path(site) / "experiments" / "conf" / "experiment" / "lsh.yaml").is_file()
