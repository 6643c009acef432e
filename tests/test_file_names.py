"""One file name, one role: no two modules of the production packages share a file name, so a
name (`memory.py`, `timing.py`) says which file is meant without its folder.

Allowed twice: the names Python gives a role (`__init__.py`, `__main__.py`, `conftest.py`) and
the per-variant shape, `variants/attention/<variant>/layer.py` and `function.py`, where the
folder is the name. Tests are not checked: a test file is named for the module it tests
(`tests/<folder>/test_<module>.py`), so its name repeats only where its module's does.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "benchmarks", "experiments", "variants")
ROLE_NAMES = {"__init__.py", "__main__.py", "conftest.py"}
PER_VARIANT = {"layer.py", "function.py"}
# Collisions known and left to the work on those folders; each entry lists exactly
# the colliding paths, so a third file of the same name still fails. Remove an entry when its
# collision is gone.
PENDING: dict[str, set[str]] = {}


def _per_variant(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return len(parts) == 4 and parts[:2] == ("variants", "attention") and path.name in PER_VARIANT


def collisions(root: Path = ROOT) -> dict[str, set[str]]:
    """File name -> the paths (relative to `root`) of the production modules of that name,
    for each name held by two modules or more outside the allowed shapes."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if path.name in ROLE_NAMES or "__pycache__" in path.parts:
                continue
            if _per_variant(path, root):
                continue
            by_name[path.name].add(path.relative_to(root).as_posix())
    return {name: paths for name, paths in sorted(by_name.items()) if len(paths) > 1}


def test_no_two_modules_share_a_file_name():
    found = collisions()
    new = {name: paths for name, paths in found.items() if PENDING.get(name) != paths}
    listing = "\n".join(f"  {name}: {', '.join(sorted(paths))}" for name, paths in new.items())
    assert not new, (
        "modules sharing a file name (rename one for what it holds, e.g. "
        f"analysis/figures/memory.py -> peak_memory.py):\n{listing}"
    )


def test_pending_collisions_are_still_there():
    gone = sorted(set(PENDING) - set(collisions()))
    assert not gone, f"no longer colliding, remove from PENDING in {__file__}: {', '.join(gone)}"


def test_a_new_collision_is_named_with_its_paths(tmp_path):
    for relative in (
        "analysis/figures/memory.py",
        "benchmarks/memory.py",
        "analysis/fine.py",
        "variants/attention/a/layer.py",
        "variants/attention/b/layer.py",
        "variants/attention/a/__init__.py",
        "variants/attention/b/__init__.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    assert collisions(tmp_path) == {
        "memory.py": {"analysis/figures/memory.py", "benchmarks/memory.py"}
    }
