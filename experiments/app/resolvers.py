"""What the Hydra app registers before Hydra composes a config: the OmegaConf resolvers the
configs may use, and the W&B logger's structured config.

    ${supports_causal:${attention.name}}   true if the variant can be causal, else false
    ${causal_only:${attention.name}}       true if the variant cannot be bidirectional
    ${timing_workers:${device}}            jobs side by side in a timing sweep: one per free
                                           CPU core at launch, 1 on CUDA (experiments/app/cores.py)

so a preset can train every variant causally where it can be and bidirectionally where it
cannot (Linformer), instead of recording the latter as skipped. The logger's schema
(`tracking.WandbLogger`) lets Hydra check the types of its settings at composition (why that
is the one structured config: experiments/config.py).

Importing this module starts no torch (`python -m experiments.run --help` imports it): the
registry is looked up when a resolver is called, not before.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import variants
from experiments.app import cores, tracking


def supports_causal(name: str) -> bool:
    """Whether attention variant `name` can be built with causal=True."""
    return variants.attention_spec(name).causal_supported


def causal_only(name: str) -> bool:
    """Whether attention variant `name` refuses causal=False (NSA, DeltaNet)."""
    return not variants.attention_spec(name).bidirectional_supported


def register() -> None:
    """Register the resolvers and the logger's schema with Hydra (idempotent); the app calls it
    when it loads, before Hydra composes the config."""
    if not OmegaConf.has_resolver("supports_causal"):
        OmegaConf.register_new_resolver("supports_causal", supports_causal)
    if not OmegaConf.has_resolver("causal_only"):
        OmegaConf.register_new_resolver("causal_only", causal_only)
    if not OmegaConf.has_resolver("timing_workers"):
        OmegaConf.register_new_resolver("timing_workers", cores.timing_workers)
    # Stored outside the `logger` group, so that `--help` does not offer it as a logger.
    ConfigStore.instance().store(name="wandb_logger_schema", node=tracking.WandbLogger)
