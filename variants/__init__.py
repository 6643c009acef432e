"""attnbench's registry of attention variants, block types and the small LM they build.

The names below are imported from their modules when first used, and so is a submodule
(`variants.layers`): importing the package, or a light module of it such as `variants.checks`,
starts no torch, so that the app's `--help` and its settings (experiments/job_config.py) load fast.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# Each public name and the module that defines it.
_HOMES = {
    # The extension API (docs/extending.md): subclass `Attention`, decorate it.
    "Attention": "variants.attention.common.base",
    "register_attention": "variants.registry",
    "register_preset": "variants.registry",
    "register_block": "variants.blocks",
    "Cache": "variants.attention.common.cache",
    "KVCache": "variants.attention.common.cache",
    "StateCache": "variants.attention.common.cache",
    "AttentionSpec": "variants.registry",
    "attention_names": "variants.registry",
    "attention_spec": "variants.registry",
    "build_attention": "variants.registry",
    "registry_table": "variants.registry",
    "block_names": "variants.blocks",
    "build_block": "variants.blocks",
    "ModelConfig": "variants.model_config",
    "resolve_shared_qk": "variants.model_config",
    "TransformerLM": "variants.model",
    "build_lm": "variants.model",
    "MultiheadAttention": "variants.layers",
    "UnsupportedCombination": "variants.checks",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    """A public name (`_HOMES`) or a submodule, imported on first use and kept."""
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
