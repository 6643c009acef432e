"""The job's configuration as the app passes it down: one typed object, built once per job.

Hydra composes `conf/` into a nested dict, the resolved config; past the app's entry
(`experiments.run.app`) it is read here and nowhere else. `ResolvedConfig` holds it as composed,
before any check, for what every record takes from it (its hash and configuration columns, the
app's bookkeeping keys, `model.shared_qk` resolved, the W&B run's config). `JobConfig.of(config)`
is the same config with its typed parts (`attention`, `block`, `task`, `model`, `train`,
`measure`, `budget`, `eval_attention`, `stages`), each checked on construction with a
`ValueError` naming the key. The defaults stay in `conf/config.yaml`; these classes hold types
and constraints, and are not Hydra structured configs. `check_added_keys` refuses a top-level
key the command line adds with `+key=` (a typo as far as the app can tell).

Imports only the floors below it (records, training, variants) and starts no torch (`--help`
imports it). The fields, and why no structured configs: docs/internals.md, "job_config".
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import variants
from experiments.records import record
from experiments.training import curriculum
from experiments.training.train_config import TrainConfig
from variants.checks import require_non_negative_int, require_positive_int

OWNER = "config"
# The ModelConfig fields the app sets from other keys than `model.*`.
# `readout` is the task's (`pooled` for MAD's compression, experiments/training/tasks/mad.py).
_MODEL_FROM_ELSEWHERE = (
    "vocab_size",
    "max_seq_len",
    "attention",
    "attention_options",
    "block",
    "readout",
)


def model_keys() -> tuple[str, ...]:
    """The keys of `model:`: the `variants.ModelConfig` fields the app does not set itself."""
    fields = dataclasses.fields(variants.ModelConfig)
    return tuple(f.name for f in fields if f.name not in _MODEL_FROM_ELSEWHERE)


def _require_positive_or_null(key: str, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
    ):
        raise ValueError(
            f"{OWNER}: option {key!r} must be a positive number or null, got {value!r}"
        )


# The forms of exact attention a kernel's speed-up can be measured against: `full`'s impls.
SPEEDUP_REFERENCES = ("sdpa", "math")
# What `measure.decode` decodes with: the job's attention kernel alone, or the whole model.
DECODE_SCOPES = ("kernel", "model")


@dataclass(frozen=True)
class MeasureConfig:
    """Which figures a job measures (`kernel`, `step`, `memory`, `approx_error`), the timing
    budget per figure (`min_run_time_s`, `warmup` untimed calls), the batches the approximation
    error is averaged over, the reference model it is measured on (`reference`: its
    `experiments.measurement.reference_model.ReferenceConfig` options and `cache_dir`) and the size
    of the matmul the machine's rate is measured with. `speedup_vs`: the forms of exact attention
    (`sdpa`, `math`: `full`'s impls) the kernel is timed against in `rounds` alternating
    rounds (experiments/measurement/measure.py); empty: the kernel is timed alone. `decode`: measure
    decoding (prefill the seq_len context, then `decode_steps` timed tokens;
    experiments/measurement/decode_cost.py) with the kernel alone (`decode_scope` kernel) or the
    whole model, every layer through its own cache (`model`: a hybrid stack's decode)."""

    kernel: bool
    step: bool
    memory: bool
    min_run_time_s: float | None
    warmup: int
    approx_error: bool
    approx_seeds: int
    reference: Mapping[str, Any]
    matmul_size: int
    speedup_vs: tuple[str, ...] = ("sdpa",)
    rounds: int = 5
    decode: bool = False
    decode_steps: int = 32
    decode_scope: str = "kernel"

    def __post_init__(self):
        for key in ("approx_seeds", "matmul_size", "rounds"):
            require_positive_int(OWNER, f"measure.{key}", getattr(self, key))
        speedup_vs = tuple(self.speedup_vs or ())
        bad = [impl for impl in speedup_vs if impl not in SPEEDUP_REFERENCES]
        if bad or len(set(speedup_vs)) != len(speedup_vs):
            raise ValueError(
                f"{OWNER}: option 'measure.speedup_vs' must list distinct entries of "
                f"{', '.join(SPEEDUP_REFERENCES)}, got {list(speedup_vs)!r}"
            )
        object.__setattr__(self, "speedup_vs", speedup_vs)
        if not isinstance(self.decode, bool):
            raise ValueError(f"{OWNER}: option 'measure.decode' must be true or false")
        if isinstance(self.decode_steps, bool) or not isinstance(self.decode_steps, int):
            raise ValueError(f"{OWNER}: option 'measure.decode_steps' must be an int >= 2")
        if self.decode_steps < 2:
            raise ValueError(f"{OWNER}: option 'measure.decode_steps' must be an int >= 2")
        if self.decode_scope not in DECODE_SCOPES:
            raise ValueError(
                f"{OWNER}: option 'measure.decode_scope' must be one of "
                f"{', '.join(DECODE_SCOPES)}, got {self.decode_scope!r}"
            )
        require_non_negative_int(OWNER, "measure.warmup", self.warmup)
        _require_positive_or_null("measure.min_run_time_s", self.min_run_time_s)


@dataclass(frozen=True)
class BudgetConfig:
    """A job's limits (None: none): memory in GiB and wall-clock seconds
    (experiments/measurement/budget.py)."""

    max_memory_gb: float | None
    max_seconds: float | None

    def __post_init__(self):
        for key in ("max_memory_gb", "max_seconds"):
            _require_positive_or_null(f"budget.{key}", getattr(self, key))


@dataclass(frozen=True)
class ResolvedConfig:
    """The job's config as Hydra composed and resolved it (a nested dict of plain values),
    before any check, and what is read from it whether or not it checks out: the record's hash
    and configuration columns, the bookkeeping keys, `model.shared_qk` resolved. `tree` is
    never changed (`at` copies it); W&B logs it as the run's config."""

    tree: Mapping[str, Any] = field(repr=False)

    @property
    def sweep(self) -> str:
        return self.tree["sweep"]

    @property
    def resume(self) -> bool:
        return self.tree["resume"]

    @property
    def logger(self) -> Mapping[str, Any] | None:
        """The W&B logger's settings (experiments/app/tracking.py); neither hashed nor measured."""
        return self.tree["logger"]

    @property
    def device(self) -> str:
        """The device as configured (`auto`, `cpu`, `cuda`, or a bad name: the job says so)."""
        return self.tree["device"]

    @property
    def shared_qk(self) -> bool | None:
        """`model.shared_qk` as a job runs it: null resolved to what the variant requires
        (`variants.resolve_shared_qk`), None if the variant is unknown. The one place the app
        resolves it."""
        try:
            return variants.resolve_shared_qk(
                self.tree["attention"]["name"], self.tree["model"]["shared_qk"]
            )
        except ValueError:
            return None

    def hash(self) -> str:
        """The record's `config_hash`: what is measured, bookkeeping left out."""
        return record.config_hash(self.tree)

    def columns(self) -> dict[str, Any]:
        """The record's configuration columns (`record.config_columns`)."""
        return record.config_columns(self.tree)

    def at(
        self, seq_len: int, batch_size: int, task: Mapping[str, Any] | None = None
    ) -> ResolvedConfig:
        """The same config at another `seq_len` and `batch_size` (a curriculum stage's), with
        `task` options replaced (a mixture's evaluation point: `n_pairs`)."""
        tree = copy.deepcopy(dict(self.tree))
        tree["seq_len"], tree["batch_size"] = seq_len, batch_size
        tree["task"] = {**tree["task"], **(task or {})}
        return ResolvedConfig(tree)


@dataclass(frozen=True)
class JobConfig(ResolvedConfig):
    """One job's configuration, typed and checked (see the module doc): the resolved config
    (`tree`, and what `ResolvedConfig` reads from it: `hash()`, `columns()`, `shared_qk`,
    `device` ...) with its parts checked. A job's config is a `ResolvedConfig` before it is
    checked, so that a config that fails its checks is still recorded under its identity."""

    seq_len: int
    batch_size: int
    seed: int
    dtype: str
    threads: int | None
    attention: Mapping[str, Any]
    block: Mapping[str, Any]
    task: Mapping[str, Any]
    model: Mapping[str, Any]
    train: TrainConfig
    measure: MeasureConfig
    budget: BudgetConfig
    eval_attention: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    stages: tuple[curriculum.Stage, ...] = field(init=False, repr=False)

    def __post_init__(self):
        require_positive_int(OWNER, "seq_len", self.seq_len)
        require_positive_int(OWNER, "batch_size", self.batch_size)
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(
                f"{OWNER}: option 'threads' must be a positive integer or null (torch's "
                f"default), got {self.threads!r}"
            )
        unknown = sorted(set(self.model) - set(model_keys()))
        if unknown:
            raise ValueError(
                f"{OWNER}: option 'model.{unknown[0]}' is unknown; "
                f"model options: {', '.join(model_keys())}"
            )
        if self.eval_attention and self.model.get("family", "attnbench") != "attnbench":
            raise ValueError(
                f"{OWNER}: option 'eval.attention' (evaluating with other kernels) needs "
                f"'model.family'='attnbench', got {self.model['family']!r}"
            )
        # A bad schedule is a config error, before anything is built.
        stages = curriculum.stages(
            self.seq_len, self.batch_size, self.train.steps, self.train.curriculum
        )
        object.__setattr__(self, "stages", tuple(stages))

    @classmethod
    def of(cls, config: Mapping[str, Any] | ResolvedConfig, added: Iterable[str] = ()) -> JobConfig:
        """The typed view of a resolved job config (Hydra's, as a plain nested dict, or that
        dict as a `ResolvedConfig`). `added`: the top-level keys the command line added with
        `+key=` (`added_keys`), refused (`check_added_keys`)."""
        resolved = config if isinstance(config, ResolvedConfig) else ResolvedConfig(config)
        tree = resolved.tree
        check_required_keys(tree)  # `~seq_len`: a job cannot run without it
        check_added_keys(tree, added)  # `+seqlen=128`: a typo, not a setting
        return cls(
            tree=tree,
            seq_len=tree["seq_len"],
            batch_size=tree["batch_size"],
            seed=tree["seed"],
            dtype=tree["dtype"],
            threads=tree["threads"],
            attention=dict(tree["attention"]),
            block=dict(tree["block"]),
            task=dict(tree["task"]),
            model=dict(tree["model"]),
            train=_typed(TrainConfig, "train", tree["train"]),
            measure=_typed(MeasureConfig, "measure", tree["measure"]),
            budget=_typed(BudgetConfig, "budget", tree["budget"]),
            eval_attention=dict((tree.get("eval") or {}).get("attention") or {}),
        )

    @property
    def attention_name(self) -> str:
        return self.attention["name"]

    def at_stage(self, stage: curriculum.Stage) -> JobConfig:
        """The configuration curriculum `stage` is recorded as: this job's at the stage's
        seq_len and batch_size (its `stages`: the curriculum's below that length, then it) and
        task options (a mixture's evaluation point, `n_pairs=P`)."""
        task = dict(stage.task)
        return dataclasses.replace(
            self,
            seq_len=stage.seq_len,
            batch_size=stage.batch_size,
            task={**self.task, **task},
            tree=self.at(stage.seq_len, stage.batch_size, task).tree,
        )

    def skipped_note(self) -> str | None:
        """One line naming the curriculum stages this job is too short for, None if none."""
        return curriculum.skipped_note(self.seq_len, self.train.curriculum, self.stages)

    def model_config(self, vocab_size: int, readout: str = "tokens") -> variants.ModelConfig:
        """The model this job measures, for a task of `vocab_size` tokens read out as the task
        asks (`readout`: `variants.ModelConfig`; ValueErrors from the registry pass through).
        Its longest sequence is the job's seq_len."""
        options = {k: v for k, v in self.attention.items() if k != "name"}
        return variants.ModelConfig(
            vocab_size=vocab_size,
            readout=readout,
            max_seq_len=self.seq_len,
            attention=self.attention_name,
            attention_options=options,
            block=self.block["name"],
            **self.model,
        )


# The keys every job reads before any check (the record's identity and configuration columns,
# the app's bookkeeping), so a config without one of them (`~seq_len` on the command line) is
# refused at the door: `check_required_keys`.
REQUIRED_KEYS = (
    "sweep",
    "resume",
    "logger",
    "seq_len",
    "batch_size",
    "seed",
    "device",
    "dtype",
    "threads",
    "attention.name",
    "block.name",
    "task.name",
    "model.d_model",
    "model.n_heads",
    "model.depth",
    "model.causal",
    "model.shared_qk",
    "train",
    "measure",
    "budget",
)


def check_required_keys(config: Mapping[str, Any]) -> None:
    """`ValueError` naming the first of `REQUIRED_KEYS` that the resolved `config` lacks."""
    for key in REQUIRED_KEYS:
        node: Any = config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ValueError(
                    f"{OWNER}: option {key!r} is missing; every job needs it "
                    f"(was it deleted with ~{key}?)"
                )
            node = node[part]


def check_writable_dir(option: str, path: str | os.PathLike) -> None:
    """`ValueError` naming `option` and `path` if the directory `path` cannot be created or
    written to (a read-only file system, no permission): the app writes every record there."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(f"{OWNER}: option {option!r}: cannot write to {path} ({reason})") from None


T = TypeVar("T")


def _typed(cls: type[T], node: str, values: Mapping[str, Any]) -> T:
    """`cls(**values)`, with a `ValueError` naming `node.key` for an unknown or missing key."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(
            f"{OWNER}: option '{node}.{unknown[0]}' is unknown; {node} options: {', '.join(names)}"
        )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"{OWNER}: option '{node}.{missing[0]}' is missing")
    return cls(**values)


def added_keys(overrides: Sequence[str], groups: Iterable[str]) -> list[str]:
    """The top-level keys that `overrides` (a job's command-line overrides, Hydra syntax) add
    with `+key=value`, leaving out config groups (`groups`, e.g. `+experiment=scaling`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = set(groups)
    keys = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if override.is_add() and "." not in key and "/" not in key and key not in groups:
            keys.append(key)
    return keys


def check_added_keys(config: Mapping[str, Any], added: Iterable[str]) -> None:
    """`ValueError` naming the first of `added` (keys the command line added, `added_keys`) and
    the known top-level key nearest to it: no config file declares it, so nothing reads it."""
    added = list(added)
    if not added:
        return
    known = sorted(k for k in config if k not in added)
    key = added[0]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"did you mean {near[0]!r}?" if near else f"top-level options: {', '.join(known)}"
    raise ValueError(
        f"{OWNER}: option {key!r} (added with +{key}=) is unknown; {hint} "
        f"(++{key}= adds a key on purpose)"
    )
