"""The package's public names, imported from their modules on first use."""

from __future__ import annotations

import importlib

import pytest

import variants


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
