"""attnbench's registry of attention variants, block types and the small LM they build."""

from variants.blocks import block_names, build_block
from variants.checks import UnsupportedCombination
from variants.config import ModelConfig, resolve_shared_qk
from variants.model import TransformerLM
from variants.registry import (
    AttentionSpec,
    attention_names,
    attention_spec,
    build_attention,
    registry_table,
)

__all__ = [
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
    "UnsupportedCombination",
]
