"""attnbench's registry of attention variants, block types and the small LM they build.

The registry's names, `ModelConfig` and `UnsupportedCombination` are imported here: none starts
torch. The names whose modules start torch (`Attention`, the caches, the blocks, `TransformerLM`,
`build_lm`, `MultiheadAttention`) are imported when first used, and so is a submodule
(`variants.layers`), so that importing the package starts no torch and the app's `--help` and
its settings (experiments/job_config.py) load fast; type checkers and IDEs read those names from
the `TYPE_CHECKING` imports below.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from variants.checks import UnsupportedCombination
from variants.model_config import ModelConfig, resolve_shared_qk
from variants.registry import (
    AttentionSpec,
    attention_names,
    attention_spec,
    build_attention,
    register_attention,
    register_preset,
    registry_table,
)

if TYPE_CHECKING:  # imported on first use (`__getattr__`): each module below starts torch
    from variants.attention.common.base import Attention
    from variants.attention.common.cache import Cache, KVCache, StateCache
    from variants.blocks import block_names, build_block, register_block
    from variants.layers import MultiheadAttention
    from variants.model import TransformerLM, build_lm

# The names imported on first use, and the module that defines each (the block above).
_LAZY = {
    "Attention": "variants.attention.common.base",
    "Cache": "variants.attention.common.cache",
    "KVCache": "variants.attention.common.cache",
    "StateCache": "variants.attention.common.cache",
    "register_block": "variants.blocks",
    "block_names": "variants.blocks",
    "build_block": "variants.blocks",
    "TransformerLM": "variants.model",
    "build_lm": "variants.model",
    "MultiheadAttention": "variants.layers",
}
__all__ = [
    # The extension API (docs/extending.md): subclass `Attention`, decorate it.
    "Attention",
    "register_attention",
    "register_preset",
    "register_block",
    "Cache",
    "KVCache",
    "StateCache",
    "AttentionSpec",
    "attention_names",
    "attention_spec",
    "build_attention",
    "registry_table",
    "block_names",
    "build_block",
    "ModelConfig",
    "resolve_shared_qk",
    "TransformerLM",
    "build_lm",
    "MultiheadAttention",
    "UnsupportedCombination",
]


def __getattr__(name: str) -> Any:
    """A name of `_LAZY` or a submodule, imported on first use and kept."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
