"""OmegaConf resolvers the configs may use, registered when the app (experiments.run) loads.

    ${supports_causal:${attention.name}}   true if the variant can be causal, else false

so a preset can train every variant causally where it can be and bidirectionally where it
cannot (Linformer), instead of recording the latter as skipped.
"""

from __future__ import annotations

from omegaconf import OmegaConf

import variants


def supports_causal(name: str) -> bool:
    """Whether attention variant `name` can be built with causal=True."""
    return variants.attention_spec(name).causal_supported


def register() -> None:
    """Register the resolvers (idempotent)."""
    if not OmegaConf.has_resolver("supports_causal"):
        OmegaConf.register_new_resolver("supports_causal", supports_causal)
