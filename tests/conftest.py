"""Shared test setup."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# Reference models (experiments/measurement/reference_model.py) trained by tests go to one fresh
# cache per session, shared with the subprocess sweeps through the environment, never to ~/.cache;
# it is removed when the session ends (`pytest_sessionfinish`), so no run leaves one behind in /tmp.
SESSION_CACHE = tempfile.mkdtemp(prefix="attnbench-test-cache-")
os.environ["ATTNBENCH_CACHE_DIR"] = SESSION_CACHE

# Correctness tests use tiny tensors: one thread avoids oversubscribing the 2-core CI machine
# (and a 10x slowdown when another process is busy). Subprocess sweeps set their own threads.
torch.set_num_threads(1)

# conf/logger/wandb.yaml as the runner passes it, offline.
WANDB_LOGGER = {
    "name": "wandb",
    "mode": "offline",
    "project": "attnbench",
    "entity": None,
    "tags": [],
    "dir": None,
    "quiet": True,
    "capture_console": False,
    "init_timeout": 90,
    "scaling_metrics": ["attn_fwd_ms", "step_ms", "peak_memory_bytes", "approx_rel_error"],
}


def output_of_another_process(script: str, *, hash_seed: str, stdin: str | None = None) -> str:
    """stdout of `python -c script` in a fresh process run from the repo, with another
    PYTHONHASHSEED: what must not depend on the process (hashes of str change with it)."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=stdin,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B offline with its files and settings under tmp_path, its service fresh per test."""
    import wandb

    from experiments.app import tracking

    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(tracking, "_disabled_reason", None)
    yield
    wandb.teardown()


EXTENDING = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def plugin_from_the_docs(folder: Path) -> str:
    """docs/extending.md's worked example (its ```python file=NAME block) written into `folder`
    as a module of the user's own; returns the module's name. The test runs what the page
    shows, so the page cannot drift from what works."""
    text = EXTENDING.read_text()
    head = "```python file="
    start = text.index(head) + len(head)
    file_name, _, rest = text[start:].partition("\n")
    (folder / file_name).write_text(rest[: rest.index("```")])
    return file_name.removesuffix(".py")


@pytest.fixture
def sigmoid_plugin(tmp_path, monkeypatch):
    """The docs' example plugin imported (module on sys.path), unregistered afterwards."""
    import variants
    from variants import plugins

    module = plugin_from_the_docs(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.load([module])
    yield module
    variants.registry._ATTENTION._entries.pop("sigmoid", None)
    plugins._loaded.pop(module, None)
    sys.modules.pop(module, None)
