"""Things of one kind by name: what the attention variants, the block types and the tasks each keep.

A `Registry` holds entries in registration order. Built-in entries register themselves when
their module is imported; `builtins` names the modules whose import does that, imported on the
first lookup so that importing a registry alone never imports every entry. An unknown name is a
`ValueError` that lists the known ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one `kind` ("attention variant", "block", "task") by name."""

    def __init__(
        self, kind: str, builtins: Sequence[str] = (), order: Callable[[T], Any] | None = None
    ):
        self.kind = kind
        self._builtins = tuple(builtins)
        self._entries: dict[str, T] = {}
        self._order = order  # a sort key on entries; registration order breaks ties

    def add(self, name: str, entry: T) -> None:
        """Register `entry` as `name`; a name registered twice is a `ValueError`."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry

    def names(self) -> list[str]:
        """Every registered name, in registration order (sorted by `order` if given)."""
        self._load()
        if self._order is None:
            return list(self._entries)
        return sorted(self._entries, key=lambda name: self._order(self._entries[name]))

    def __getitem__(self, name: str) -> T:
        """The entry `name`; `ValueError` listing the available names if unknown."""
        self._load()
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}")
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _load(self) -> None:
        builtins, self._builtins = self._builtins, ()
        for module in builtins:
            importlib.import_module(module)  # its entries register on import
