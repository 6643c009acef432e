"""What the Hydra app registers before Hydra composes a config: the OmegaConf resolvers the
configs may use, and the W&B logger's structured config.

    ${supports_causal:${attention.name}}   true if the variant can be causal, else false
    ${causal_only:${attention.name}}       true if the variant cannot be bidirectional
    ${timing_workers:${device}}            jobs side by side in a timing sweep
    ${variants:causal,decodes}             every registered variant with those capabilities
    ${job_dir:}                            a multirun job's dir, named by its configuration
    ${tuned_lr:TABLE,${attention.name}}    the learning rate a tuning grid chose for the
                                           variant, from conf/tuned/TABLE.yaml

The logger's schema (`tracking.WandbLogger`) lets Hydra check the types of its settings at
composition. Importing this module starts no torch (`--help` imports it): the registry is
looked up when a resolver is called, not before. Each resolver: docs/internals.md, "resolvers".
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import variants
from experiments.app import cores, job_dirs, tracking
from experiments.records.record import one_line

log = logging.getLogger("attnbench")


def _spec(name: str):
    """Variant `name`'s spec, the plugins of the environment imported first: a launcher's
    worker resolves a job's config before the job imports its `plugins` (the app puts them in
    ATTNBENCH_PLUGINS for its workers: `plugin_options.prepare`)."""
    variants.plugins.load()
    return variants.attention_spec(name)


def supports_causal(name: str) -> bool:
    """Whether attention variant `name` can be built with causal=True."""
    return _spec(name).causal_supported


def causal_only(name: str) -> bool:
    """Whether attention variant `name` refuses causal=False (NSA, DeltaNet)."""
    return not _spec(name).bidirectional_supported


def variant_list(*words: str) -> str:
    """The variants that have every capability among `words` (and the named ones first), as
    a sweep's comma-separated list."""
    variants.plugins.load()  # as `_spec`
    return ",".join(variants.registry.select(*map(str, words)))


def config_dir() -> Path:
    """The Hydra configs: `conf/` of the checkout, which an install puts in `experiments/conf/`."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "conf"
    return installed if (installed / "config.yaml").is_file() else package.parent / "conf"


class TunedTableError(ValueError):
    """A tuned table that cannot be used (missing, or an entry that is not a known variant and
    a positive rate or null): one line naming the file and the entry. The app prints it as a
    config error (`experiments.run`)."""


def tuned_lr(table: str, name: str, default: float | None = None) -> float:
    """The learning rate that `conf/tuned/<table>.yaml` holds for attention variant `name`: the
    rate a preset's grid chose on validation (`analysis.tuning --write`). A variant the table
    lacks, or holds as null (its grid had no usable rate), trains untuned: at `default`, else
    at `default_lr()`, with a warning naming both; its record says `lr_source: untuned`
    (`lr_source_of`), so no table shows that rate as tuned."""
    rate = tuned_rates(table).get(name)
    if rate is not None:
        return rate
    fallback = default_lr() if default is None else float(default)
    log.warning(
        "tuned_lr: %s.yaml has no usable rate for attention %r; training it untuned at lr %g "
        "(run its grid, e.g. train.lr=1e-3,3e-3,1e-2, and analysis.tuning --write)",
        table,
        name,
        fallback,
    )
    return fallback


def tuned_rates(table: str) -> dict[str, float | None]:
    """`conf/tuned/<table>.yaml` checked: attention variant -> its rate, or None (no usable
    rate). `TunedTableError`, one line naming the file, if it is missing or holds anything but
    known variants (`variants.attention_names`) with positive rates or null."""
    path = config_dir() / "tuned" / f"{table}.yaml"
    if not path.is_file():
        raise TunedTableError(f"tuned_lr: no table {table!r} ({path} does not exist)")
    try:
        rates = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as error:  # noqa: BLE001 — YAML's and OmegaConf's own errors
        raise TunedTableError(f"tuned_lr: {path} is not YAML: {one_line(error)}") from None
    if not isinstance(rates, dict):
        raise TunedTableError(f"tuned_lr: {path} is not a mapping of attention -> lr")
    variants.plugins.load()  # a plugin's variant may hold a rate here
    known = set(variants.attention_names())
    checked: dict[str, float | None] = {}
    for key, value in rates.items():
        if key not in known:
            raise TunedTableError(
                f"tuned_lr: {path}: {key!r} is not an attention variant (known: "
                f"{', '.join(sorted(known))})"
            )
        number = value is not None and not isinstance(value, bool)
        if number and isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            checked[key] = float(value)
        elif value is None:
            checked[key] = None
        else:
            raise TunedTableError(
                f"tuned_lr: {path}: {key!r}: {value!r} is not a positive learning rate (or "
                "null: no usable rate)"
            )
    return checked


def default_lr() -> float:
    """The rate an untuned variant trains at: `train.lr` of conf/config.yaml (the rate every
    job has unless a preset or the command line says otherwise)."""
    return float(OmegaConf.load(config_dir() / "config.yaml").train.lr)


def lr_source(table: str, name: str) -> str:
    """`tuned` if `conf/tuned/<table>.yaml` holds a rate for `name`, else `untuned`."""
    return "tuned" if tuned_rates(table).get(name) is not None else "untuned"


_TUNED_LR = re.compile(r"^\$\{tuned_lr:\s*([^,}\s]+)\s*,")


def lr_source_of(cfg: DictConfig) -> str | None:
    """The record's `lr_source` for a job's config (unresolved, as Hydra gives it): `tuned` or
    `untuned` when `train.lr` is `${tuned_lr:TABLE,...}` (`lr_source`), None when it is a rate
    given as such (the preset's, or the command line's: a grid)."""
    train = cfg.get("train")
    if train is None or not OmegaConf.is_interpolation(train, "lr"):
        return None
    found = _TUNED_LR.match(str(train._get_node("lr")._value()))
    return None if found is None else lr_source(found.group(1), cfg.attention.name)


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
    if not OmegaConf.has_resolver("job_dir"):
        OmegaConf.register_new_resolver("job_dir", job_dirs.job_dir)
    # Stored outside the `logger` group, so that `--help` does not offer it as a logger.
    ConfigStore.instance().store(name="wandb_logger_schema", node=tracking.WandbLogger)
