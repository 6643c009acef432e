"""Attention kernels, one package per variant; importing this package registers them all.

Every variant has one shape, as flash-linear-attention splits a layer from its kernel: a package
`<name>/` whose `layer` module is the registry's entry (the `Attention` subclass: options,
capabilities, pattern, decoding, FLOPs) and whose `function` module, where the variant has a
kernel of its own, holds it. What variants share lives in `common/`; no variant imports another
variant's module (tests/variants/attention/test_layout.py).

Every package here is imported (a new one registers by being here); the registry lists them by
their `family`, in the order of Tay et al.'s survey (`variants.registry.FAMILIES`).
"""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common"):
    importlib.import_module(f"{__name__}.{_module}")
