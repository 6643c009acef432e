"""Fixtures for the runner's tests: the CLI in a subprocess, and composed configs in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from experiments import job_config as job_config_module
from experiments.app import plugin_options, resolvers

ROOT = Path(__file__).resolve().parents[2]  # the repo: `python -m experiments.run` runs from here
CONF = ROOT / "conf"

# About a second per job on one core; every CLI test measures this configuration.
TINY = (
    "model.d_model=32",
    "model.n_heads=2",
    "train.steps=2",
    "train.warmup=1",
    "measure.min_run_time_s=0.01",
    "measure.approx_seeds=1",
    "measure.reference.steps=2",
    "measure.reference.seq_len=32",
    "measure.reference.batch_size=2",
    "measure.reference.long_seq_len=256",
    "measure.reference.long_steps=1",
    "measure.reference.fit_steps=2",
    "measure.matmul_size=64",
)
# Switches off every measurement but training: for tests of what a job trains and records.
MEASURE_NOTHING = (
    "measure.kernel=false",
    "measure.step=false",
    "measure.memory=false",
    "measure.approx_error=false",
)
TIMEOUT_S = 300  # per CLI call: a hung sweep fails its test instead of the whole session


def tiny(overrides) -> list[str]:
    """TINY + `overrides`, at seq_len 64 unless they set it (a multirun rejects a repeated key)."""
    length = [] if any(o.startswith("seq_len=") for o in overrides) else ["seq_len=64"]
    return [*TINY, *length, *overrides]


class Cli:
    """`python -m experiments.run ...` in a subprocess from the repo root.

    W&B keeps its files (settings, cache, artifacts) under `home`, never in ~; WANDB_MODE is
    unset so the default `logger=wandb` runs in its configured offline mode. One thread per job
    keeps the 2-core test machine from being oversubscribed. THP_MEM_ALLOC_ENABLE is unset, as
    in a fresh shell (the job sets it itself); `env` adds or overrides variables per launch.
    """

    def __init__(self, home: Path):
        self.home = home

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var in (
            "THP_MEM_ALLOC_ENABLE",
            "WANDB_MODE",
            "WANDB_API_KEY",
            "WANDB_BASE_URL",
            "WANDB_PROJECT",
            "WANDB_ENTITY",
            "HYDRA_FULL_ERROR",
        ):
            env.pop(var, None)
        for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            env[var] = str(self.home / var.lower())
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        return env

    def start(
        self, *args: str, new_session: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Launch without waiting (to run several at once); collect with `Popen.communicate`.

        `new_session`: in a process group of its own, which `os.killpg` can signal as a
        terminal's Ctrl-C signals its foreground job (W&B's service included).
        """
        return subprocess.Popen(
            [sys.executable, "-m", "experiments.run", *args],
            cwd=ROOT,
            env=self.env() | (env or {}),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
        )

    def run(self, *args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        process = self.start(*args)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def start_single(
        self, run_dir: Path, *overrides: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """A tiny single run (no -m) into `run_dir`, launched without waiting."""
        return self.start(*tiny(overrides), f"hydra.run.dir={run_dir}", env=env)

    @staticmethod
    def sweep_args(sweep_dir: Path, *overrides: str) -> list[str]:
        """The arguments of a tiny multirun into `sweep_dir`."""
        return ["-m", *tiny(overrides), f"hydra.sweep.dir={sweep_dir}"]

    def sweep(self, sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
        """A tiny multirun into `sweep_dir`; a non-zero exit fails the test, showing stderr."""
        done = self.run(*self.sweep_args(sweep_dir, *overrides))
        assert done.returncode == 0, done.stderr[-3000:]
        return done


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path / "home")


@pytest.fixture(scope="module")
def module_cli(tmp_path_factory) -> Cli:
    """For module-scoped fixtures that launch once for several tests."""
    return Cli(tmp_path_factory.mktemp("home"))


@pytest.fixture
def resolved_config():
    """compose(*overrides) -> the resolved job config, a plain dict as `experiments.run` sees it."""

    resolvers.register()  # as experiments.run does when it loads
    plugin_options.store_group_options()  # and before Hydra composes: variants with no YAML

    def build(*overrides: str) -> dict:
        GlobalHydra.instance().clear()  # in case an earlier test left Hydra initialised
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=True)

    return build


@pytest.fixture
def job_config(resolved_config):
    """compose(*overrides) -> the typed `JobConfig` that `experiments.run` passes down."""

    def build(*overrides: str) -> job_config_module.JobConfig:
        return job_config_module.JobConfig.of(resolved_config(*overrides))

    return build
