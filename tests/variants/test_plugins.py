"""Plugins (variants/plugins.py): the user's modules imported by name, environment or entry
point, one line when one fails; the docs' worked example as a user's variant."""

from __future__ import annotations

import pytest
import torch

import variants
from variants import conformance, plugins


def test_the_docs_example_registers_and_keeps_every_property(sigmoid_plugin):
    assert "sigmoid" in variants.attention_names()
    assert variants.attention_spec("sigmoid").options == {"bias": -4.0}
    results = conformance.check("sigmoid")
    assert [r for r in results if r.status == conformance.FAILED] == []
    claimed = {r.name for r in results if r.status == conformance.HELD}
    assert {"causal_gradient", "causal_append", "padding", "documents", "decode"} <= claimed


def test_the_docs_example_runs_in_the_drop_in_module_with_grouped_heads(sigmoid_plugin):
    mha = variants.MultiheadAttention(32, 4, attention="sigmoid", n_kv_heads=2, causal=True)
    x = torch.randn(2, 16, 32)
    assert mha(x).shape == x.shape


def test_a_plugin_is_imported_once_from_the_list_or_the_environment(tmp_path, monkeypatch):
    (tmp_path / "counting_plugin.py").write_text(
        "import builtins\nbuiltins._imports_seen = getattr(builtins, '_imports_seen', 0) + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.ENV, "counting_plugin")
    assert "counting_plugin" in plugins.load(["counting_plugin"])
    plugins.load()
    import builtins

    assert builtins._imports_seen == 1
    del builtins._imports_seen
    plugins._loaded.pop("counting_plugin")


@pytest.mark.parametrize(
    ("setting", "expected"),
    [("a.b", ["a.b"]), ("[a.b,c]", ["a.b", "c"]), (["x", "y.z"], ["x", "y.z"]), (None, [])],
)
def test_a_plugins_setting_is_a_list_of_modules(setting, expected):
    assert plugins.parse(setting) == expected


def test_a_plugin_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('no GPU here\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(plugins.PluginError) as missing:
        plugins.load(["no_such_plugin_module"])
    assert str(missing.value) == (
        "plugin 'no_such_plugin_module' failed to import: ModuleNotFoundError: "
        "No module named 'no_such_plugin_module'"
    )
    with pytest.raises(plugins.PluginError, match="broken_plugin.*RuntimeError: no GPU here$"):
        plugins.load(["broken_plugin"])
    with pytest.raises(plugins.PluginError, match="dotted module names"):
        plugins.load(["not a module"])


def test_installed_packages_advertise_plugins_through_the_entry_point_group(tmp_path, monkeypatch):
    """`[project.entry-points."attnbench.plugins"]` in a package's pyproject: imported by
    `load`, once; one that fails is one line naming it."""
    from importlib import metadata

    (tmp_path / "advertised_plugin.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [metadata.EntryPoint("mine", "advertised_plugin", plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: found)
    assert "advertised_plugin" in plugins.load()
    assert plugins._loaded["advertised_plugin"].LOADED
    plugins._loaded.pop("advertised_plugin")
    found[:] = [metadata.EntryPoint("bad", "no_such_advertised_module", plugins.ENTRY_POINT_GROUP)]
    with pytest.raises(plugins.PluginError, match="'no_such_advertised_module' failed to import"):
        plugins.load()
