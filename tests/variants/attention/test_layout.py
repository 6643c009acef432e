"""variants/attention/ as one package per variant beside `common/`, and no variant importing
another variant's module: read from the source (every import, at the top or inside a function,
relative ones resolved), as tests/experiments/test_packages.py reads the floors."""

from __future__ import annotations

from pathlib import Path

import pytest

import variants
from tests.experiments.test_packages import module_imports

ATTENTION = Path(__file__).resolve().parents[3] / "variants" / "attention"
PACKAGE = "variants.attention"
VARIANTS = sorted(
    p.name for p in ATTENTION.iterdir() if (p / "__init__.py").is_file() and p.name != "common"
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ATTENTION.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every module `path` (or `source` read as if at `path`) imports, as full dotted names,
    read by the floors test's reader (imports inside functions, relative and named ones)."""
    return module_imports(
        path.read_text() if source is None else source,
        module_name(path),
        package=path.name == "__init__.py",
    )


def owner(name: str) -> str | None:
    """The variant (or `common`) a dotted name lies in, None outside variants/attention/."""
    if not name.startswith(PACKAGE + "."):
        return None
    return name.split(".")[2]


def test_every_registered_variant_is_a_package_with_a_layer_and_nothing_else_lies_beside_them():
    assert sorted(p.name for p in ATTENTION.glob("*.py")) == ["__init__.py"]
    assert (ATTENTION / "common" / "__init__.py").is_file()
    for name in VARIANTS:
        assert (ATTENTION / name / "layer.py").is_file(), name
    homes = {variants.attention_spec(n).cls.__module__ for n in variants.attention_names()}
    assert homes == {f"{PACKAGE}.{name}.layer" for name in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variant_imports_no_other_variants_module(variant):
    for path in sorted((ATTENTION / variant).glob("**/*.py")):
        others = {n for n in imported(path) if owner(n) not in (None, "common", variant)}
        assert not others, f"{path.relative_to(ATTENTION)} imports {sorted(others)}"


def test_the_common_pieces_import_no_variant():
    for path in sorted((ATTENTION / "common").glob("**/*.py")):
        variants_ = {n for n in imported(path) if owner(n) not in (None, "common")}
        assert not variants_, f"{path.relative_to(ATTENTION)} imports {sorted(variants_)}"


def test_the_reader_sees_imports_inside_functions_and_relative_ones():
    source = "def f():\n    from ..lsh import hashing\n    import variants.attention.nsa\n"
    names = imported(ATTENTION / "moba" / "layer.py", source)
    assert {"variants.attention.lsh.hashing", "variants.attention.nsa"} <= names
    assert owner("variants.attention.lsh.hashing") == "lsh" and owner("variants.checks") is None
