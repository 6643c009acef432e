"""Plugins through the app (experiments/app/plugin_options.py): `plugins=[...]` and
ATTNBENCH_PLUGINS reach the composition and every worker, a variant or task with no YAML gets
its options from its constructor, presets list the registry, and a plugin that fails is one
line."""

from __future__ import annotations

import json
import os

import pytest
from hydra.core.config_store import ConfigStore

from experiments.app import plugin_options as plugins
from experiments.app import resolvers
from tests.conftest import plugin_from_the_docs
from tests.experiments.conftest import MEASURE_NOTHING

TASK_PLUGIN = '''
from experiments.training.tasks import Batch, SeededTask, generator, register_task
import torch


@register_task
class Counting(SeededTask):
    """Predict the next integer of a counting sequence mod `modulus`."""

    name = "counting"
    has_accuracy = True

    def __init__(self, *, seq_len, batch_size, seed, modulus: int = 7):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.modulus = modulus
        self.vocab_size = modulus

    def batch(self, split, index):
        g = generator(self.seed, split, index)
        start = torch.randint(0, self.modulus, (self.batch_size, 1), generator=g)
        tokens = (start + torch.arange(self.seq_len + 1)) % self.modulus
        mask = torch.ones(self.batch_size, self.seq_len, dtype=torch.bool)
        return Batch(tokens[:, :-1], tokens[:, 1:], mask)
'''


def test_plugins_are_read_from_the_arguments():
    assert plugins.from_arguments(["plugins=[a.b,c]", "seq_len=3", "+plugins=d"]) == [
        "a.b",
        "c",
        "d",
    ]
    assert plugins.from_arguments(["attention=full"]) == []


def test_a_variant_without_yaml_gets_a_config_option_with_its_defaults(sigmoid_plugin):
    plugins.store_group_options()
    node = ConfigStore.instance().load("attention/sigmoid.yaml").node
    assert dict(node) == {"name": "sigmoid", "bias": -4.0}
    with pytest.raises(Exception):  # noqa: B017 — a built-in keeps its YAML, no second option
        ConfigStore.instance().load("attention/full.yaml")


def test_presets_list_the_registry_by_capability(sigmoid_plugin):
    causal = resolvers.variant_list("full", "lsh", "causal", "published").split(",")
    assert causal[:2] == ["full", "lsh"] and "sigmoid" in causal
    assert "linformer" not in causal and "combined" not in causal and "longformer" in causal
    assert "sigmoid" in resolvers.variant_list("decodes").split(",")
    with pytest.raises(ValueError, match="'fast' is neither a registered"):
        resolvers.variant_list("fast")


def results(sweep_dir):
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"))]


@pytest.mark.slow
def test_a_plugin_variant_and_task_run_in_joblib_workers_with_no_yaml(cli, tmp_path):
    """The documented route: the docs' module on PYTHONPATH, named on the command line,
    measured beside exact attention in a joblib multirun; a task plugin from the environment."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    module = plugin_from_the_docs(folder)
    (folder / "counting_task.py").write_text(TASK_PLUGIN)
    sweep = tmp_path / "sweep"
    env = {
        "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "ATTNBENCH_PLUGINS": "counting_task",
    }
    process = cli.start(
        *cli.sweep_args(sweep, f"plugins=[{module}]", "attention=sigmoid,full"),
        "task=counting",
        "task.modulus=5",
        "hydra/launcher=joblib",
        "logger=none",
        "report=false",
        *MEASURE_NOTHING,
        env=env,
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    records = {r["attention"]: r for r in results(sweep)}
    assert set(records) == {"sigmoid", "full"}
    assert {r["status"] for r in records.values()} == {"ok"}, records
    assert records["sigmoid"]["attention.bias"] == -4.0
    assert records["sigmoid"]["task.modulus"] == 5


@pytest.mark.slow
def test_a_plugin_option_is_set_on_the_command_line(cli, tmp_path):
    folder = tmp_path / "user_code"
    folder.mkdir()
    module = plugin_from_the_docs(folder)
    run_dir = tmp_path / "run"
    process = cli.start_single(
        run_dir,
        f"plugins=[{module}]",
        "attention=sigmoid",
        "attention.bias=-3",
        "logger=none",
        *MEASURE_NOTHING,
        env={"PYTHONPATH": str(folder)},
    )
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    record = json.loads((run_dir / "result.json").read_text())
    assert (record["attention"], record["attention.bias"], record["status"]) == (
        "sigmoid",
        -3,
        "ok",
    )


def test_a_plugin_that_fails_to_import_stops_before_any_job_in_one_line(cli, tmp_path):
    sweep = tmp_path / "sweep"
    done = cli.run(*cli.sweep_args(sweep, "plugins=[no_such_plugin_module]", "logger=none"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: plugin 'no_such_plugin_module' failed to import: ModuleNotFoundError: "
        "No module named 'no_such_plugin_module'"
    )
    assert not sweep.exists()


def test_a_workers_resolvers_import_the_plugins_the_app_named(tmp_path, monkeypatch):
    """A launcher's worker resolves `${causal_only:${attention.name}}` before the job imports
    its plugins: the app hands them on in ATTNBENCH_PLUGINS, and the resolvers import them."""
    import variants

    (tmp_path / "late_plugin.py").write_text(
        "import variants\n\n\n@variants.register_attention\nclass Late(variants.Attention):\n"
        "    name = 'late'\n    exact = False\n    time_complexity = memory_complexity = 'O(1)'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ATTNBENCH_PLUGINS", "")  # recorded, so the value prepare sets is undone
    monkeypatch.setattr(plugins, "store_group_options", lambda: None)
    plugins.prepare(["plugins=[late_plugin]"])
    import os

    assert os.environ["ATTNBENCH_PLUGINS"] == "late_plugin"  # what workers inherit
    variants.registry._ATTENTION._entries.pop("late")  # as in a fresh worker process
    from variants import plugins as variant_plugins

    variant_plugins._loaded.pop("late_plugin")
    import sys

    sys.modules.pop("late_plugin")
    assert resolvers.supports_causal("late") is True
    variants.registry._ATTENTION._entries.pop("late")
    variant_plugins._loaded.pop("late_plugin")
