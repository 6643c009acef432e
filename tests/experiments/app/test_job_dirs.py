"""A multirun job's dir named by its configuration (experiments/app/job_dirs.py): the resolver
`${job_dir:}` of `hydra.sweep.subdir`, on the composed config Hydra resolves it on. The CLI's
sweeps in these dirs: tests/experiments/test_run.py (a re-run with a value inserted)."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

from experiments.app import job_dirs, plugin_options, resolvers
from experiments.job_config import JobIdentity
from tests.experiments.conftest import CONF


@pytest.fixture
def composed():
    """compose(*overrides) -> the whole config of job number 7, `hydra` included, as Hydra
    resolves the job's subdir on it."""
    resolvers.register()
    plugin_options.store_group_options()

    def build(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.job.num = 7
        return cfg

    return build


def _subdir(cfg) -> str:
    return str(OmegaConf.select(cfg, "hydra.sweep.subdir"))


def test_a_job_dir_is_its_attention_length_and_the_hash_of_its_record(composed, resolved_config):
    """The name's hash is the record's `config_hash` of the job's resolved config (threads
    null: the basic launcher)."""
    overrides = ("attention=linear", "seq_len=96", "model.depth=2")
    digest = JobIdentity(resolved_config(*overrides)).config_hash
    assert _subdir(composed(*overrides)) == f"linear-L96-{digest}"


def test_under_joblib_the_hash_is_of_the_threads_each_job_gets(composed, resolved_config):
    """The job records `threads` as the launcher splits the cores (`threads_per_job`), so its
    dir's hash is of that config too, not of threads null."""
    overrides = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seq_len=64")
    config = resolved_config(*overrides)
    config["threads"] = max(1, (os.cpu_count() or 1) // 2)
    assert _subdir(composed(*overrides)) == f"full-L64-{JobIdentity(config).config_hash}"
    assert _subdir(composed(*overrides)) != _subdir(composed("seq_len=64"))


def test_what_changes_the_measurement_changes_the_dir_and_bookkeeping_does_not(composed):
    base = _subdir(composed("seq_len=64"))
    assert base.startswith("full-L64-")
    assert _subdir(composed("seq_len=64", "logger=none", "sweep=other", "resume=false")) == base
    assert _subdir(composed("seq_len=64", "budget.max_seconds=10")) == base
    assert len({base, _subdir(composed("seq_len=64", "seed=1")), _subdir(composed())}) == 3


def test_a_config_that_cannot_be_resolved_gets_a_numbered_dir(composed):
    """The job itself then says why in one line (a missing tuned table: exit 2)."""
    cfg = composed("train.lr=${tuned_lr:no_such_table_here,full}")
    assert _subdir(cfg) == "unresolved-7"


def test_a_name_keeps_only_plain_characters():
    config = {"attention": {"name": "my/own variant"}, "seq_len": 8, "seed": 0}
    assert job_dirs.name(config).startswith("my_own_variant-L8-")
    assert len(job_dirs.name(config).rsplit("-", 1)[1]) == 12
