"""Plugins: the user's own modules that register variants, blocks or tasks on import.

Three ways to name them, all imported by `load` (idempotent: a module is imported once):

    plugins=[my_pkg.my_attention]          the app's command line (and the `plugins` config key)
    ATTNBENCH_PLUGINS=my_pkg.a,my_pkg.b    the environment (comma- or colon-separated)
    [project.entry-points."attnbench.plugins"] in an installed package's pyproject.toml

A module that fails to import is a `PluginError` of one line naming it and its error.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable
from importlib import metadata

ENV = "ATTNBENCH_PLUGINS"
ENTRY_POINT_GROUP = "attnbench.plugins"
_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_loaded: dict[str, object] = {}


class PluginError(ValueError):
    """A plugin that could not be imported: its name and the error, on one line."""


def from_environment() -> list[str]:
    """The modules `ATTNBENCH_PLUGINS` names."""
    return [m for m in re.split(r"[,:\s]+", os.environ.get(ENV, "")) if m]


def parse(value: object) -> list[str]:
    """A `plugins` setting as module names: a list, or one string ("a", "[a,b]", "a,b")."""
    if value is None:
        return []
    if isinstance(value, str):
        return [m for m in re.split(r"[,\s]+", value.strip().strip("[]")) if m]
    if isinstance(value, Iterable):
        return [str(m) for m in value]
    raise PluginError(f"option 'plugins' must be a list of module names, got {value!r}")


def load(modules: Iterable[str] = ()) -> list[str]:
    """Import `modules`, then those of `ATTNBENCH_PLUGINS` and of the `attnbench.plugins`
    entry points; returns the names imported (each once per process)."""
    names = [*modules, *from_environment()]
    for name in names:
        _import(name)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.value not in _loaded:
            try:
                _loaded[entry.value] = entry.load()
            except Exception as error:  # one line, whatever the plugin raised
                raise PluginError(_failed(entry.value, error)) from error
        names.append(entry.value)
    return names


def _import(name: str) -> None:
    if name in _loaded:
        return
    if not _MODULE.match(name):
        raise PluginError(f"plugin {name!r}: option 'plugins' takes dotted module names")
    try:
        _loaded[name] = importlib.import_module(name)
    except Exception as error:  # one line, whatever the plugin raised
        raise PluginError(_failed(name, error)) from error


def _failed(name: str, error: BaseException) -> str:
    detail = str(error).splitlines()[0] if str(error) else ""
    return f"plugin {name!r} failed to import: {type(error).__name__}: {detail}"
