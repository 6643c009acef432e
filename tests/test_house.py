"""House rules read from the source: short module docstrings, reasons instead of tracker numbers,
and docstrings that name modules that exist.

A module docstring says what the module is and its contract, in at most `MAX_DOC_LINES` lines;
derivations and measurements live in docs/ (docs/variants/<name>.md, docs/tasks.md,
docs/internals.md). Code, configs and tests say why something is so in words, never by citing a
tracker's number, which means nothing to a reader of the code and goes stale when it closes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("variants", "experiments", "analysis", "benchmarks")
MAX_DOC_LINES = 15
# A citation of a tracker's entry: the word, then its number (after a space or "#", or none).
CITATION = re.compile(r"\bissue ?#?[0-9]+", re.IGNORECASE)
# Where code, configs and tests live; prose (docs/, *.md) may cite what it likes.
CODE_GLOBS = ("*.py", "*.yaml", "*.yml", "*.toml", "Makefile", ".ci/*")
CODE_FOLDERS = (*PACKAGES, "tests", "conf")


def modules(packages=PACKAGES) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).glob("**/*.py"))


def docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return len(doc.splitlines()) if doc else 0


def code_files() -> list[Path]:
    found = {p for pattern in CODE_GLOBS for p in ROOT.glob(pattern) if p.is_file()}
    for folder in CODE_FOLDERS:
        found |= {
            p
            for pattern in CODE_GLOBS
            for p in (ROOT / folder).glob(f"**/{pattern}")
            if p.is_file() and "__pycache__" not in p.parts
        }
    return sorted(found)


def citations(text: str) -> list[str]:
    return CITATION.findall(text)


def test_every_module_docstring_is_short():
    long = {
        str(p.relative_to(ROOT)): n for p in modules() if (n := docstring_lines(p)) > MAX_DOC_LINES
    }
    assert not long, f"module docstrings over {MAX_DOC_LINES} lines (the rest: docs/): {long}"


def test_no_code_config_or_test_cites_an_issue_number():
    cited = {}
    for path in code_files():
        lines = path.read_text(errors="replace").splitlines()
        hits = [f"{i}: {line.strip()}" for i, line in enumerate(lines, 1) if citations(line)]
        if hits:
            cited[str(path.relative_to(ROOT))] = hits
    assert not cited, f"say the reason, not the tracker's number: {cited}"


def test_the_rules_see_what_they_are_for(tmp_path):
    cited = "iss" + "ue"  # spelled apart, so this file cites nothing itself
    assert citations(f"# {cited} 39: the page lacked a dozen") == [f"{cited} 39"]
    assert citations(f"({cited.title()} #26, scenario 5)") and citations(f"{cited}7")
    assert not citations(f"the t{cited} 3 layers") and not citations(f"an {cited} of scale")
    long = tmp_path / "long.py"
    long.write_text('"""' + "\n".join(["line"] * (MAX_DOC_LINES + 1)) + '\n"""\n')
    assert docstring_lines(long) == MAX_DOC_LINES + 1
    assert ROOT / "tests" / "test_house.py" in code_files()
    assert ROOT / "conf" / "config.yaml" in code_files()


@pytest.mark.parametrize("package", PACKAGES)
def test_a_packages_docstring_table_names_its_own_modules(package):
    """A package docstring that lists its modules one a line (`name   what it does`) lists
    modules that exist beside it: a renamed or moved module is renamed there too."""
    stale = {}
    for init in sorted((ROOT / package).glob("**/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for line in doc.splitlines()[1:]:
            if (row := re.match(r"([a-z_][a-z0-9_]*) {2,}\S", line)) is None:
                continue
            name = row.group(1)
            if not ((init.parent / f"{name}.py").is_file() or (init.parent / name).is_dir()):
                stale.setdefault(str(init.relative_to(ROOT)), []).append(name)
    assert not stale, f"docstrings name modules that do not exist: {stale}"
