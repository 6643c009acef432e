"""The job's configuration as the app passes it down: one typed object, built once per job.

Hydra composes `conf/` into a nested dict, the resolved config; past the app's entry
(`experiments.run.app`) it is read here and nowhere else. `JobIdentity` is computed from it once,
before any check: the record's hash and configuration columns, the app's bookkeeping keys, the
W&B run's config. `JobConfig.of(config)` is the job as typed data (`attention`, `block`, `task`,
`model`, `train`, `measure`, `budget`, `eval_attention`, `stages`), each part checked on
construction with a `ValueError` naming the key. The defaults stay in `conf/config.yaml`; these
classes hold types and constraints, and are not Hydra structured configs. `check_added_keys`
refuses a top-level key the command line adds with `+key=` (a typo as far as the app can tell).

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
    whole model, every layer through its own cache (`model`: a hybrid stack's decode).
    `decode_state`: `decode_state_bytes` alone, untimed (the same prefill, at `decode_scope`),
    for a training preset's records; nothing more where `decode` measures it anyway."""

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
    decode_state: bool = False

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
        for key in ("decode", "decode_state"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{OWNER}: option 'measure.{key}' must be true or false")
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
class JobIdentity:
    """What a record is, computed once at the door from the composed config (a nested dict of
    plain values), before any check, so a config that fails its checks is still recorded under
    it: `config_hash` and the configuration `columns` (`experiments.records.record`), and the
    composed `tree` itself, which W&B logs as the run's config; and the app's bookkeeping keys
    (never hashed), read whether or not the config checks."""

    tree: Mapping[str, Any] = field(repr=False)
    config_hash: str = field(init=False)
    columns: Mapping[str, Any] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "config_hash", record.config_hash(self.tree))
        object.__setattr__(self, "columns", record.config_columns(self.tree))

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
        """The record's `shared_qk` (`resolved_shared_qk`), whether or not the config checks."""
        return resolved_shared_qk(self.tree)

    def at(self, stage: curriculum.Stage) -> JobIdentity:
        """The identity curriculum `stage` is recorded under: this config at the stage's
        seq_len and batch_size, with its task options (a mixture's point: `n_pairs`)."""
        tree = copy.deepcopy(dict(self.tree))
        tree["seq_len"], tree["batch_size"] = stage.seq_len, stage.batch_size
        tree["task"] = {**tree["task"], **dict(stage.task)}
        return JobIdentity(tree)


def resolved_shared_qk(config: Mapping[str, Any]) -> bool | None:
    """`model.shared_qk` as a job runs it: null resolved to what the variant requires
    (`variants.resolve_shared_qk`), None if the variant is unknown. The one place the app
    resolves it."""
    try:
        return variants.resolve_shared_qk(config["attention"]["name"], config["model"]["shared_qk"])
    except ValueError:
        return None


@dataclass(frozen=True)
class JobConfig:
    """One job's configuration, typed and checked (see the module doc), plain data: what is
    measured and how, `shared_qk` resolved. `JobConfig.of(config)` builds it from the composed
    config; the record's identity and the app's bookkeeping are `JobIdentity`'s."""

    device: str  # as configured: auto, cpu, cuda (or a bad name: setup says so)
    shared_qk: bool | None
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
    def of(cls, config: Mapping[str, Any], added: Iterable[str] = ()) -> JobConfig:
        """The typed view of a composed job config (Hydra's, resolved, as a plain nested dict;
        its required keys checked at the door, `check_required_keys`). `added`: the top-level
        keys the command line added with `+key=` (`added_keys`), refused (`check_added_keys`)."""
        check_added_keys(config, added)  # `+seqlen=128`: a typo, not a setting
        return cls(
            device=config["device"],
            shared_qk=resolved_shared_qk(config),
            seq_len=config["seq_len"],
            batch_size=config["batch_size"],
            seed=config["seed"],
            dtype=config["dtype"],
            threads=config["threads"],
            attention=dict(config["attention"]),
            block=dict(config["block"]),
            task=dict(config["task"]),
            model=dict(config["model"]),
            train=_typed(TrainConfig, "train", config["train"]),
            measure=_typed(MeasureConfig, "measure", config["measure"]),
            budget=_typed(BudgetConfig, "budget", config["budget"]),
            eval_attention=dict((config.get("eval") or {}).get("attention") or {}),
        )

    @property
    def attention_name(self) -> str:
        return self.attention["name"]

    def at_stage(self, stage: curriculum.Stage) -> JobConfig:
        """This job at curriculum `stage`: its seq_len and batch_size (its `stages`: the
        curriculum's below that length, then it) and task options (a mixture's point)."""
        return dataclasses.replace(
            self,
            seq_len=stage.seq_len,
            batch_size=stage.batch_size,
            task={**self.task, **dict(stage.task)},
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
