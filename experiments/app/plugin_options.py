"""The app's side of plugins: import them before Hydra composes a config, and give every
registered attention variant, block and task a config-group option even without a YAML.

`attention=<name>` needs an option `name` in the `attention` group: `conf/attention/<name>.yaml`
where the project ships one, else a node stored in Hydra's ConfigStore here, holding the
variant's options at their constructor's defaults (the registry's `AttentionSpec.options`), so
`attention.<option>=...` works as for a YAML's. Tasks and blocks the same way. The nodes travel
to every launcher's workers with Hydra's singletons; the job imports the plugins again there
(`load`), from its config's `plugins` and the environment.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hydra.core.config_store import ConfigStore

from experiments.app.resolvers import config_dir
from variants import plugins

# The arguments a task class takes from the job, not from its config group.
_TASK_ARGUMENTS = ("self", "seq_len", "batch_size", "seed")
_HELP = ("--help", "-h", "--hydra-help")


def from_arguments(argv: Sequence[str]) -> list[str]:
    """The modules named by a `plugins=...` override among command-line arguments."""
    found: list[str] = []
    for argument in argv:
        key, sep, value = argument.lstrip("+").partition("=")
        if sep and key == "plugins":
            found += plugins.parse(value)
    return found


def prepare(argv: Sequence[str]) -> None:
    """Before Hydra runs: import the plugins the arguments and the environment name, then
    store a config-group option for every registry entry without a YAML. `--help` without
    plugins reads conf/ alone (it starts no torch)."""
    modules = from_arguments(argv)
    if not modules and not plugins.from_environment() and any(a in _HELP for a in argv):
        return
    load(modules)
    # Launchers' workers (joblib's, submitit's) inherit the environment, and may resolve a
    # job's config (its resolvers read the registry) before the job imports its plugins.
    named = list(dict.fromkeys([*plugins.from_environment(), *modules]))
    if named:
        os.environ[plugins.ENV] = ",".join(named)
    store_group_options()


def load(modules: Iterable[str]) -> None:
    """Import the plugins (`variants.plugins.load`); a job calls it with its config's."""
    plugins.load(plugins.parse(list(modules)))


def store_group_options() -> None:
    """A ConfigStore option in `attention`, `block` and `task` for each registered name that
    conf/ holds no YAML for (idempotent)."""
    import variants  # the registry: torch, which only a run (never --help) needs
    from experiments.training import tasks

    for name in variants.attention_names():
        _store("attention", name, variants.attention_spec(name).options)
    for name in variants.block_names():
        _store("block", name, {})
    for name in tasks.task_names():
        _store("task", name, _task_options(tasks.task_class(name)))


def _store(group: str, name: str, options: Mapping[str, Any]) -> None:
    if (config_dir() / group / f"{name}.yaml").is_file():
        return
    node = {"name": name} | {k: _plain(group, name, k, v) for k, v in options.items()}
    ConfigStore.instance().store(group=group, name=name, node=node)


def _task_options(cls: type) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name: p.default
        for p in params
        if p.name not in _TASK_ARGUMENTS
        and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is not p.empty
    }


def _plain(group: str, name: str, option: str, value: Any) -> Any:
    """`value` as a config value: None, bool, int, float, str or a list of them."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and all(_is_plain(v) for v in value):
        return value
    if _is_plain(value):
        return value
    raise ValueError(
        f"{group} {name!r}: option {option!r} has default {value!r}; a config option's "
        f"default must be None, a bool, int, float, str or a list of them"
    )


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
