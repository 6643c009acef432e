"""What the Hydra app registers before Hydra composes a config: the OmegaConf resolvers the
configs may use, and the W&B logger's structured config.

    ${supports_causal:${attention.name}}   true if the variant can be causal, else false
    ${causal_only:${attention.name}}       true if the variant cannot be bidirectional
    ${timing_workers:${device}}            jobs side by side in a timing sweep: one per free
                                           CPU core at launch, 1 on CUDA (experiments/app/cores.py)
    ${variants:causal,decodes}             every registered variant with those capabilities, as a
                                           sweep's comma list (variants.registry.select: names
                                           given first, then the rest in registry order), so a
                                           preset takes new variants and plugins without an edit
    ${tuned_lr:TABLE,${attention.name}}    the learning rate a tuning grid chose for the variant,
                                           from conf/tuned/TABLE.yaml (`python -m analysis.tuning
                                           SWEEP --write conf/tuned/TABLE.yaml` writes it)

so a preset can train every variant causally where it can be and bidirectionally where it
cannot (Linformer), instead of recording the latter as skipped. The logger's schema
(`tracking.WandbLogger`) lets Hydra check the types of its settings at composition (why that
is the one structured config: experiments/job_config.py).

Importing this module starts no torch (`python -m experiments.run --help` imports it): the
registry is looked up when a resolver is called, not before.
"""

from __future__ import annotations

from pathlib import Path

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


def variant_list(*words: str) -> str:
    """The variants that have every capability among `words` (and the named ones first), as
    a sweep's comma-separated list."""
    return ",".join(variants.registry.select(*map(str, words)))


def config_dir() -> Path:
    """The Hydra configs: `conf/` of the checkout, which an install puts in `experiments/conf/`."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "conf"
    return installed if (installed / "config.yaml").is_file() else package.parent / "conf"


def tuned_lr(table: str, name: str) -> float:
    """The learning rate that `conf/tuned/<table>.yaml` holds for attention variant `name`: the
    rate a preset's grid chose on validation (`analysis.tuning --write`). A variant the table
    lacks is an error naming both and how to get a rate: a guessed rate would be untuned."""
    path = config_dir() / "tuned" / f"{table}.yaml"
    if not path.is_file():
        raise ValueError(f"tuned_lr: no table {table!r} ({path} does not exist)")
    rates = OmegaConf.to_container(OmegaConf.load(path))
    if name not in rates:
        raise ValueError(
            f"tuned_lr: {path.name} has no learning rate for attention {name!r} (it has: "
            f"{', '.join(rates)}); run its grid (train.lr=1e-3,3e-3,1e-2) or set train.lr="
        )
    return float(rates[name])


def register() -> None:
    """Register the resolvers and the logger's schema with Hydra (idempotent); the app calls it
    when it loads, before Hydra composes the config."""
    if not OmegaConf.has_resolver("supports_causal"):
        OmegaConf.register_new_resolver("supports_causal", supports_causal)
    if not OmegaConf.has_resolver("causal_only"):
        OmegaConf.register_new_resolver("causal_only", causal_only)
    if not OmegaConf.has_resolver("timing_workers"):
        OmegaConf.register_new_resolver("timing_workers", cores.timing_workers)
    if not OmegaConf.has_resolver("variants"):
        OmegaConf.register_new_resolver("variants", variant_list)
    if not OmegaConf.has_resolver("tuned_lr"):
        OmegaConf.register_new_resolver("tuned_lr", tuned_lr)
    # Stored outside the `logger` group, so that `--help` does not offer it as a logger.
    ConfigStore.instance().store(name="wandb_logger_schema", node=tracking.WandbLogger)
