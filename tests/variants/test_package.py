"""The package's public names: the light ones imported at once, the rest on first use."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import variants

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", variants.__all__)
def test_each_public_name_is_its_modules(name):
    home = {
        "variants.registry": ("AttentionSpec", "attention_names", "attention_spec"),
        "variants.blocks": ("block_names", "build_block"),
        "variants.model": ("TransformerLM",),
    }
    value = getattr(variants, name)
    module = importlib.import_module(value.__module__)
    assert getattr(module, name) is value and name in dir(variants)
    for module_name, names in home.items():  # a few homes, named independently of the table
        if name in names:
            assert getattr(importlib.import_module(module_name), name) is value


def test_a_submodule_is_imported_on_first_use_and_anything_else_is_refused():
    assert variants.layers is importlib.import_module("variants.layers")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        variants.no_such_name  # noqa: B018


def test_the_lazy_names_are_the_ones_tools_read_and_every_public_name_is_listed():
    """Type checkers and IDEs read the lazy names from the `TYPE_CHECKING` imports; the package
    imports them from `_LAZY` on first use: the two name the same names in the same modules, and
    `__all__` is those and the names imported at the top."""
    tree = ast.parse(Path(variants.__file__).read_text())
    for_tools, at_top = {}, set()
    for node in tree.body:
        checking = isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body if checking else [node]:
            if isinstance(statement, ast.ImportFrom) and statement.module.startswith("variants"):
                names = {alias.name: statement.module for alias in statement.names}
                if checking:
                    for_tools.update(names)
                else:
                    at_top.update(names)
    assert for_tools == variants._LAZY
    assert sorted(variants.__all__) == sorted({*for_tools, *at_top})


def test_importing_the_package_and_its_eager_names_starts_no_torch():
    code = (
        "import sys, variants\n"
        "assert variants.ModelConfig and variants.attention_spec and variants.AttentionSpec\n"
        "assert 'torch' not in sys.modules, 'torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
