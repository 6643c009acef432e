"""A multirun job's dir, named by its configuration: `<sweep dir>/<attention>-L<seq_len>-<hash>`.

conf/config.yaml sets `hydra.sweep.subdir: ${job_dir:}`: Hydra resolves it for each job, before
the job runs, on the job's composed config, and `job_dir` names it by the same resolved config
the job records (`job_config`) and the same hash (`record.config_hash`): e.g.
`full-L1024-3f2a9c1b0d4e`. So a re-run of a sweep with a value inserted or reordered puts each
configuration in the dir that held it before, never another configuration in a dir that held
one; the attention and the length are there for the eye, the hash is the identity. A config
that cannot be resolved (a damaged tuned table) gets `unresolved-<job number>`, where the job
then says why in one line. A `hydra.sweep.subdir=...` of the command line still wins.

Importing this module starts no torch (the app's `--help` imports it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from experiments.records import record

# Characters a dir name keeps from a config value; anything else becomes "_".
_PLAIN = re.compile(r"[^A-Za-z0-9_.]+")


def parallel_jobs(hydra_cfg) -> int:
    """Jobs the launcher runs side by side: joblib's n_jobs (-1: every core), else 1."""
    launcher = hydra_cfg.launcher
    if "joblib" not in str(launcher.get("_target_", "")).lower():
        return 1
    n_jobs = int(launcher.get("n_jobs", -1))
    return (os.cpu_count() or 1) if n_jobs <= 0 else n_jobs


def threads_per_job(hydra_cfg) -> int | None:
    """With the joblib launcher, split the cores between the parallel jobs (None = torch default).

    n_jobs processes each using every core oversubscribe the machine and make every timing
    slower and noisier; giving each job cores // n_jobs threads keeps them apart.
    """
    if "joblib" not in str(hydra_cfg.launcher.get("_target_", "")).lower():
        return None
    return max(1, (os.cpu_count() or 1) // parallel_jobs(hydra_cfg))


def job_config(cfg: DictConfig, hydra_cfg) -> dict[str, Any]:
    """The job's resolved config as a plain nested dict, as the job records it: `threads` null
    becomes the launcher's threads per job (`threads_per_job`)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    if config.get("threads") is None:
        config["threads"] = threads_per_job(hydra_cfg)
    return config


def name(config: dict[str, Any]) -> str:
    """`<attention>-L<seq_len>-<config hash>` for a resolved job config (`job_config`)."""
    attention = (config.get("attention") or {}).get("name")
    label = "-".join(
        _PLAIN.sub("_", str(part)) for part in (attention, f"L{config.get('seq_len')}")
    )
    return f"{label}-{record.config_hash(config)}"


def job_dir(*, _root_: DictConfig) -> str:
    """The resolver `${job_dir:}`: the name (`name`) of the job whose whole config, `hydra`
    included, is `_root_`; `unresolved-<job number>` if the job's config cannot be resolved."""
    hydra_cfg = _root_.hydra
    try:
        job = OmegaConf.masked_copy(_root_, [key for key in _root_ if key != "hydra"])
        with _quiet():  # the job resolves it again and says what it has to say then
            return name(job_config(job, hydra_cfg))
    except Exception:  # noqa: BLE001 — the job itself reports what does not resolve
        return f"unresolved-{hydra_cfg.job.num}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The app's logger silent within the block (a resolver's warnings, e.g. an untuned rate)."""
    logger = logging.getLogger("attnbench")
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was
