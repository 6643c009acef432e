"""One job's record: a flat dict of documented columns, its identity and its provenance.

`SCHEMA` lists every column with its part (identity, config, measured, provenance), type and
unit; the store, the W&B logger, the loader and the report read it. Columns carry their unit in
the name (`_ms`, `_bytes`, `_per_s`). Configuration columns come from
the resolved Hydra config, flattened with dots (`attention.n_hashes`, `model.depth`); the
short aliases `attention`, `block`, `task`, `seq_len`, ... are the ones analysis groups by.
The provenance values are read where a job runs (experiments/measurement/provenance.py): this
schema floor imports nothing else of experiments.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.records.files import write_atomic

# --- The schema: every column a record has, with its type and unit -----------------------------
#
# Read by the store (the printed table, typed Parquet), the W&B logger (the default
# `logger.scaling_metrics`, and the check of that list), the loader (analysis/load.py: types,
# and the columns every frame has) and the report. Nothing else lists the columns.

OK, OOM, TIMEOUT, SKIPPED, ERROR, DIVERGED = "ok", "oom", "timeout", "skipped", "error", "diverged"
STATUSES = (OK, OOM, TIMEOUT, SKIPPED, ERROR, DIVERGED)

# The parts of a record.
IDENTITY, CONFIG, MEASURED, PROVENANCE = "identity", "config", "measured", "provenance"
MIB = 2**20  # `_bytes` columns are shown in MiB (the printed table, report tables and figures)


@dataclass(frozen=True)
class Column:
    """One record column: its part, its Python type (values may also be None) and unit.

    `key`: for a config column, the resolved config key it stands for (`attention` is
    `attention.name`); `resolved`: the job resolves it as it runs (device auto -> cpu).
    `optional`: a loader adds no empty column for it when a source lacks it (a metric of some
    tasks only, a note of newer records). `shown`: in the table a job and a sweep print;
    `task_metric`: a task's quality figure, printed after those, whose `<name>@<label>` columns
    are the same figure with another kernel (`eval.attention`); `scaling`: logged against
    seq_len in W&B unless `logger.scaling_metrics` says otherwise. `derived`: a resolved config
    column computed from other keys (`head_dim` = d_model / n_heads), with no key of its own.
    """

    name: str
    part: str
    type: type
    unit: str = ""
    doc: str = ""
    key: str | None = None
    resolved: bool = False
    optional: bool = False
    shown: bool = False
    task_metric: bool = False
    scaling: bool = False
    derived: bool = False

    @property
    def numeric(self) -> bool:
        return self.type in (int, float)


def _config(name: str, type_: type, doc: str, key: str | None = None, **flags) -> Column:
    return Column(name, CONFIG, type_, doc=doc, key=key or name, **flags)


def _measured(name: str, type_: type, unit: str, doc: str, **flags) -> Column:
    return Column(name, MEASURED, type_, unit, doc, **flags)


SCHEMA: tuple[Column, ...] = (
    Column("sweep", IDENTITY, str, doc="the sweep's name: W&B group, `multirun/<sweep>`"),
    Column(
        "job",
        IDENTITY,
        str,
        doc="the job's dir in its sweep: `<attention>-L<seq_len>-<config_hash>` under the "
        "default subdir (`<job>/<label>`: a stage or a mixture's count)",
    ),
    Column("config_hash", IDENTITY, str, doc="hash of what is measured (`config_hash`)"),
    Column("status", IDENTITY, str, doc=" | ".join(STATUSES)),
    Column("error", IDENTITY, str, doc="why a job did not end ok, on one line"),
    _config("attention", str, "the attention variant", "attention.name"),
    _config("block", str, "the block type", "block.name"),
    _config("task", str, "the task", "task.name"),
    _config("seq_len", int, "tokens per sequence"),
    _config("batch_size", int, "sequences per step"),
    _config("d_model", int, "model width", "model.d_model"),
    _config("n_heads", int, "attention heads", "model.n_heads"),
    _config("head_dim", int, "width of one head: d_model / n_heads", resolved=True, derived=True),
    _config(
        "n_kv_heads",
        int,
        "key/value heads (grouped KV heads; null resolved: n_heads)",
        "model.n_kv_heads",
        resolved=True,
    ),
    _config("depth", int, "layers", "model.depth"),
    _config(
        "layers",
        str,
        "the stack: the repeating unit of model.layers, e.g. '3×deltanet+full' (a variant "
        "with options: 'sliding_window(window=64)'); null resolved: the attention variant",
        "model.layers",
        resolved=True,
    ),
    _config("causal", bool, "causal attention", "model.causal"),
    _config("dtype", str, "float32 | bfloat16 | float16"),
    _config("seed", int, "the job's seed"),
    _config("device", str, "cpu | cuda (auto resolved)", resolved=True),
    _config("threads", int, "torch intra-op threads (null resolved)", resolved=True),
    _config("shared_qk", bool, "shared QK (null resolved)", "model.shared_qk", resolved=True),
    _config(
        "lr_source",
        str,
        "tuned | untuned: train.lr from the preset's tuned table (`${tuned_lr:...}`, conf/tuned/), "
        "or, the table having no usable rate for the variant, its default rate "
        "(experiments/app/resolvers.py); empty: train.lr as given (a preset's, a grid's)",
        resolved=True,
        derived=True,
        optional=True,
    ),
    _measured("attn_fwd_ms", float, "ms", "kernel forward, median", shown=True, scaling=True),
    _measured("attn_fwd_iqr_ms", float, "ms", "its interquartile range over timed blocks"),
    _measured("attn_fwd_bwd_ms", float, "ms", "kernel forward+backward", shown=True, scaling=True),
    _measured("attn_fwd_bwd_iqr_ms", float, "ms", "its interquartile range"),
    _measured("step_ms", float, "ms", "one training step", shown=True, scaling=True),
    _measured("step_iqr_ms", float, "ms", "its interquartile range"),
    _measured(
        "peak_memory_bytes",
        int,
        "bytes",
        "peak live tensors in a training step",
        shown=True,
        scaling=True,
    ),
    _measured(
        "attn_fwd_bwd_peak_bytes",
        int,
        "bytes",
        "peak live tensors of the kernel alone, forward+backward",
        shown=True,
        scaling=True,
    ),
    _measured("peak_rss_bytes", int, "bytes", "the process's peak resident set size"),
    _measured("attn_fwd_flops", int, "FLOP", "useful FLOPs of the kernel's forward"),
    _measured("attn_fwd_bwd_flops", int, "FLOP", "and of its forward+backward"),
    _measured("attn_fwd_gflops_per_s", float, "GFLOP/s", "achieved rate, forward"),
    _measured(
        "attn_fwd_bwd_gflops_per_s", float, "GFLOP/s", "achieved rate, fwd+bwd", scaling=True
    ),
    _measured(
        "attn_fwd_bwd_matmul_fraction",
        float,
        "fraction",
        "that rate / the matmul's in the same round, median over the kernel's rounds",
    ),
    _measured(
        "matmul_fraction_warning",
        bool,
        "",
        "attn_fwd_bwd_matmul_fraction above 1.05: the kernel or the matmul was timed wrong "
        "(timing_warning says so too)",
        optional=True,
    ),
    _measured(
        "matmul_peak_gflops_per_s",
        float,
        "GFLOP/s",
        "the machine's matmul rate, timed in the kernel's rounds (median over them)",
    ),
    _measured(
        "approx_rel_error",
        float,
        "relative",
        "error against exact attention on a trained model's q, k, v",
        shown=True,
        scaling=True,
    ),
    _measured("approx_rel_error_gaussian", float, "relative", "the same on N(0, 1) q, k, v"),
    _measured("approx_reference_bits_per_byte", float, "bits/byte", "the reference model's eval"),
    _measured("approx_reference_digest", str, "", "the reference model measured on", optional=True),
    # Errors in distribution: the reference's trained length, the kernel's fitting,
    # the kernel swap, and why an error is missing.
    _measured(
        "approx_reference_seq_len", int, "tokens", "the reference's trained length", optional=True
    ),
    # Grouped KV heads: the error is against grouped-head exact attention on k, v of
    # this many heads; empty in records from before, which measured plain multi-head attention.
    _measured(
        "approx_reference_n_kv_heads",
        int,
        "",
        "key/value heads of the reference and of the k, v the error is measured on (n_kv_heads)",
        optional=True,
    ),
    _measured(
        "approx_kernel_fit_steps",
        int,
        "",
        "steps of the fit to the reference whose state was kept, the best on held-out text "
        "(0: as initialised; approx_kernel_fit_seq_len empty: no learned state)",
        optional=True,
    ),
    _measured(
        "approx_kernel_fit_seq_len",
        int,
        "tokens",
        "the length the kernel was fitted at (measure.reference.fit_max_len); empty: no fit",
        optional=True,
    ),
    _measured(
        "swap_delta_bits_per_byte",
        float,
        "bits/byte",
        "held-out bits/byte change when the kernel replaces exact attention in the reference",
        optional=True,
    ),
    _measured(
        "approx_error_note",
        str,
        "",
        "why approx_rel_error or the swap was not measured",
        optional=True,
    ),
    _measured("train_loss", float, "nats/token", "mean of the last training steps", shown=True),
    _measured("eval_loss", float, "nats/token", "after training", shown=True),
    _measured("eval_accuracy", float, "fraction", "after training", task_metric=True),
    _measured(
        "eval_bits_per_byte",
        float,
        "bits/byte",
        "after training, byte-level tasks",
        task_metric=True,
        optional=True,
    ),
    _measured("tokens_per_s", float, "tokens/s", "training throughput", scaling=True),
    _measured("n_parameters", int, "", "the model's parameters"),
    _measured("job_seconds", float, "s", "the job's wall time"),
    _measured("curriculum_stage", int, "", "which curriculum stage (0 = the first)"),
    _measured(
        "trained_steps",
        int,
        "",
        "optimiser steps taken when evaluated (train.steps is the cap: early stops take fewer)",
    ),
    _measured(
        "train_stop",
        str,
        "",
        "why training (the record's stage) ended: cap (its steps ran out), accuracy "
        "(train.stop_accuracy reached at every validated point), plateau (train.patience)",
        optional=True,
    ),
    _measured(
        "valid_accuracy",
        float,
        "fraction",
        "the last validation at the record's point, on the validation split (held out from "
        "training and from eval_accuracy): what a learning-rate grid is chosen on",
        optional=True,
    ),
    _measured("valid_loss", float, "nats/token", "and its loss", optional=True),
    _measured(
        "key_abs_cos",
        float,
        "",
        "mean |cos| between a head's keys at different positions, the trained model on one eval "
        "batch, mean over layers (1: every key points one way; kernel_diagnostics per layer)",
        optional=True,
    ),
    _measured(
        "gate_mean",
        float,
        "",
        "mean of the kernel's first per-token gate (DeltaNet's beta), as key_abs_cos",
        optional=True,
    ),
    _measured(
        "kernel_diagnostics",
        str,
        "",
        "key_abs_cos and gate_mean per layer, e.g. 'layer 0: |cos| 0.31, gate 0.52; ...'",
        optional=True,
    ),
    _measured("precision", str, "", "float32 | bf16-mixed | fp16-mixed", optional=True),
    # Quality you can trust (recall tasks, MAD, ListOps): chance, the floor, an interval, learned.
    _measured(
        "chance_accuracy",
        float,
        "fraction",
        "a uniform guess among the answers: 1 / n_values (MAD: its answer tokens; ListOps: 1/10)",
        optional=True,
    ),
    _measured(
        "floor_accuracy",
        float,
        "fraction",
        "the best guess blind to what is asked, on the eval batches: recall and MAD the most "
        "frequent answer token in the context, ListOps the most frequent answer",
        optional=True,
    ),
    _measured(
        "eval_accuracy_ci_low",
        float,
        "fraction",
        "Wilson 95 % interval of eval_accuracy over the distinct pairs answered: low",
        optional=True,
    ),
    _measured("eval_accuracy_ci_high", float, "fraction", "and high", optional=True),
    _measured(
        "eval_distinct_pairs",
        int,
        "",
        "distinct (sequence, key) pairs evaluated (copying, compression: positions; ListOps: "
        "expressions)",
        optional=True,
    ),
    _measured(
        "learned",
        bool,
        "",
        "an evaluation of any stage so far reached 90 % accuracy (the job's record: of the run)",
        optional=True,
    ),
    _measured(
        "steps_to_learn",
        int,
        "",
        "optimiser steps from the start to the first evaluation at 90 %",
        optional=True,
    ),
    # Decoding (measure.decode, experiments/measurement/decode_cost.py): the kernel alone at the
    # job's shape, or the whole model (measure.decode_scope).
    _measured("decode_prefill_ms", float, "ms", "prefill of seq_len tokens into a cache"),
    _measured("decode_prefill_peak_bytes", int, "bytes", "peak live tensors of the prefill"),
    _measured(
        "decode_state_bytes",
        int,
        "bytes",
        "what the decoder keeps to generate the next token at seq_len context (batch_size "
        "sequences): the kernel's cache (measure.decode_scope=kernel), every layer's summed "
        "(model); with measure.decode_state alone, untimed; older records' cache_bytes",
    ),
    _measured("decode_ms_per_token", float, "ms/token", "one token at seq_len context"),
    _measured("decode_iqr_ms_per_token", float, "ms/token", "its interquartile range"),
    _measured("decode_copy_gb_per_s", float, "GB/s", "copy of a cache-sized tensor, read+write"),
    _measured("decode_read_gb_per_s", float, "GB/s", "decode_state_bytes / decode_ms_per_token"),
    _measured("decode_bandwidth_fraction", float, "fraction", "decode read rate / copy rate"),
    _measured("timing_warning", str, "", "figures whose timing spread widely", optional=True),
    # Nothing lost, nothing silent: float16 gradient checks
    # (experiments/training/train.py)
    _measured(
        "grad_warning",
        str,
        "",
        "float16: steps whose gradients were all zero or skipped by the loss scaler",
        optional=True,
    ),
    # In-job speed-ups against exact attention (measure.speedup_vs,
    # experiments/measurement/measure.py): exact attention's time / the kernel's in the same round,
    # median over alternating rounds.
    _measured("speedup_vs_sdpa", float, "×", "fwd+bwd speed-up over SDPA", shown=True),
    _measured("speedup_vs_sdpa_iqr", float, "×", "its interquartile range over rounds"),
    _measured("fwd_speedup_vs_sdpa", float, "×", "forward speed-up over SDPA", optional=True),
    _measured("fwd_speedup_vs_sdpa_iqr", float, "×", "its IQR over rounds", optional=True),
    _measured("speedup_vs_math", float, "×", "fwd+bwd speed-up over O(L²)", optional=True),
    _measured("speedup_vs_math_iqr", float, "×", "its IQR over rounds", optional=True),
    _measured("speedup_rounds", int, "", "alternating rounds behind the speed-ups", optional=True),
    # --- the fused CUDA path: which path the job's kernel ran ---
    _measured(
        "kernel_path",
        str,
        "",
        "fused | explicit: the kernel's attention on PyTorch's fused kernels, or explicit "
        "matmuls (`Attention.kernel_path`)",
        optional=True,
    ),
    # The exact baseline named. Full attention's `impl=sdpa_<backend>` pins it; plain
    # `sdpa` is what PyTorch's own dispatcher chooses for the timed inputs.
    _measured(
        "sdpa_backend",
        str,
        "",
        "math | flash | efficient | cudnn: the SDPA backend full attention ran on the job's "
        "kernel inputs (`Attention.sdpa_backend`): the pinned one of `impl=sdpa_<backend>`, for "
        "`impl=sdpa` PyTorch's choice (`torch._fused_sdp_choice`; `<fwd>/<fwd+bwd>` if they "
        "differ, `auto` if this torch cannot say); empty for every other kernel and impl=math",
        optional=True,
    ),
    Column("git_commit", PROVENANCE, str, doc="HEAD of the checkout, +dirty if changed"),
    Column("torch_version", PROVENANCE, str),
    Column("device_name", PROVENANCE, str, doc="GPU or CPU model"),
    Column("hostname", PROVENANCE, str),
    Column("timestamp", PROVENANCE, str, doc="UTC, ISO 8601"),
    Column(
        "thp_mem_alloc",
        PROVENANCE,
        bool,
        doc="THP_MEM_ALLOC_ENABLE=1 as the job ran: huge-page CPU allocation (on unless the "
        "environment says 0)",
    ),
    Column("offline_run_dir", PROVENANCE, str, doc="the job's W&B offline run, if any"),
    Column(
        "parallel_jobs",
        PROVENANCE,
        int,
        doc="jobs of the sweep run side by side (the joblib launcher's n_jobs; 1 otherwise); "
        "a timing sweep runs one per free core (experiments/app/cores.py)",
    ),
)
COLUMNS = {c.name: c for c in SCHEMA}


def column(name: str) -> Column | None:
    """The schema's column `name` (`<name>@<label>` is `<name>`'s), None for a config key."""
    return COLUMNS.get(name.split("@", 1)[0])


def names(part: str, *, optional: bool | None = None) -> tuple[str, ...]:
    """The columns of one part, in schema order (`optional` True/False: only those/the others)."""
    return tuple(
        c.name for c in SCHEMA if c.part == part and (optional is None or c.optional == optional)
    )


ERROR_CHARS = 500


def one_line(error: BaseException) -> str:
    """How a failure is told, in the `error` column and in the runner's and the W&B logger's
    warnings: `Type: message` with the whole message on one line (its white space folded, so a
    multi-line message keeps its later lines), cut to ERROR_CHARS characters."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:ERROR_CHARS]


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool: a value a numeric column can hold."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def type_problem(rec: dict[str, Any]) -> str | None:
    """Why the JSON object `rec` is not a record, or None: its `config_hash` is not a non-empty
    text, its `status` not one of STATUSES, or a schema column holds a value of another type
    (None is every column's gap; an int column takes a whole float, a float column an int).
    The store leaves such a file out, naming it, rather than letting one hand-edited value
    (a numeric timestamp, seq_len 64.5) stop the gathering of every other record."""
    digest, status = rec.get("config_hash"), rec.get("status")
    if not isinstance(digest, str) or not digest:
        return f"'config_hash' is {digest!r}, not a non-empty text"
    if status not in STATUSES:
        return f"'status' is {status!r}, not one of {', '.join(STATUSES)}"
    for name, value in rec.items():
        spec = column(name)
        if spec is None or value is None or _is_type(value, spec.type):
            continue
        return f"{name!r} is {value!r} ({type(value).__name__}), not {spec.type.__name__}"
    return None


def _is_type(value: Any, type_: type) -> bool:
    if type_ is bool or isinstance(value, bool):
        return type_ is bool and isinstance(value, bool)
    if type_ is int:  # and one Parquet's int64 holds
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        return whole and -(2**63) <= value < 2**63
    if type_ is float:
        return isinstance(value, (int, float))
    return isinstance(value, type_)


def non_finite(columns: dict[str, Any]) -> list[str]:
    """The names of the float values in `columns` that are NaN or infinite: a record would
    show them as null, "not measured", so a job with any of them is `diverged` instead."""
    return [k for k, v in columns.items() if isinstance(v, float) and not math.isfinite(v)]


# The short names analysis groups by, and the resolved config key each one stands for.
ALIASES = {c.name: c.key for c in SCHEMA if c.part == CONFIG and not c.resolved}
# Config keys a job resolves and records as it ran (device auto -> cpu, threads null -> n,
# model.shared_qk null -> as the variant requires), and the key each one stands for.
RESOLVED = {c.name: c.key for c in SCHEMA if c.resolved}
SHOWN = tuple(c.name for c in SCHEMA if c.shown)
TASK_METRICS = tuple(c.name for c in SCHEMA if c.task_metric)
SCALING_METRICS = tuple(c.name for c in SCHEMA if c.scaling)

# Keys of the resolved config that do not change what is measured, so they stay out of the hash.
# A budget decides whether a measurement completes, not what it measures: re-running an oom
# configuration with a larger budget replaces its record.
_BOOKKEEPING = ("logger", "sweep", "resume", "fail_on", "report", "plugins", "train.progress")
_UNHASHED = (*_BOOKKEEPING, "budget")
# Keys added after records existed, whose default does what the code did before them: left out
# of the hash at that default, so a record made before the key existed keeps its hash (and a
# re-run of its sweep still finds it). A key whose default changed what is measured (Performer's
# eps) is not listed: records from before it are another configuration.
HASH_NEUTRAL_DEFAULTS = {
    "train.stop_accuracy": None,
    "train.patience": None,
    "task.query_format": "repeated",
    "task.train_lengths": None,
    "attention.short_conv": 0,
    "attention.feature_map": "identity",
    "attention.output_norm": False,
    "attention.shared_selection": False,
    "attention.init": "xavier",  # linformer's probes (docs/variants/linformer.md)
    "attention.learn_projection": True,
    "attention.dt_min": 0.001,  # the state layers' initial decay (docs/variants/common.md)
    "attention.dt_max": 0.1,
    "model.projection_bias": True,
    "model.n_kv_heads": None,
    "model.layers": None,
    "measure.decode_scope": "kernel",
    "measure.decode_state": False,
}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become JSON strings so every value is a scalar."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(list(value))
        else:
            flat[name] = value
    return flat


def config_hash(config: dict[str, Any]) -> str:
    """Stable 12-hex-digit hash of what a job measures (the resolved config minus bookkeeping)."""
    flat = {
        k: v
        for k, v in flatten(config).items()
        if not _is_under(k, _UNHASHED)
        and not (k in HASH_NEUTRAL_DEFAULTS and v == HASH_NEUTRAL_DEFAULTS[k])
    }
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_columns(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration part of a record: short aliases, `head_dim` and `n_kv_heads` resolved
    (`_heads`), the stack's `layers` (`stack_label`), plus every flattened config key."""
    flat = flatten(config)
    columns = {alias: flat[key] for alias, key in ALIASES.items()}
    columns.update(_heads(flat))
    columns["layers"] = stack_label(
        (config.get("model") or {}).get("layers"), flat.get("attention.name")
    )
    # Every other resolved key too (e.g. a preset's `train_as`, `eval.attention.*`), so a
    # record says everything that made it; the logger's settings are not measurement.
    for key, value in flat.items():
        if not key.startswith("logger."):
            columns.setdefault(key, value)
    return columns


def _heads(flat: dict[str, Any]) -> dict[str, Any]:
    """The resolved `head_dim` (d_model / n_heads; None if they do not divide: the job's check
    says why) and `n_kv_heads` (null: n_heads, plain multi-head attention)."""
    d_model, n_heads = flat.get("model.d_model"), flat.get("model.n_heads")
    whole = all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (d_model, n_heads)
    )
    n_kv_heads = flat.get("model.n_kv_heads")
    return {
        "head_dim": d_model // n_heads if whole and d_model % n_heads == 0 else None,
        "n_kv_heads": n_heads if n_kv_heads is None else n_kv_heads,
    }


def stack_label(layers: Any, attention: Any = None) -> str | None:
    """The record's `layers`: a hybrid stack's unit (`model.layers`) with runs of one entry
    counted, ["deltanet", "deltanet", "deltanet", "full"] -> "3×deltanet+full", an entry with
    options as "sliding_window(window=64)"; null: `attention` (every layer runs it)."""
    if layers is None:
        return attention if isinstance(attention, str) else None
    if isinstance(layers, (str, dict)) or not isinstance(layers, (list, tuple)):
        return str(layers)  # not a list: the job's check says why
    names = []
    for entry in layers:
        if isinstance(entry, dict):
            options = ",".join(f"{k}={v}" for k, v in entry.items() if k != "name")
            names.append(f"{entry.get('name')}({options})" if options else str(entry.get("name")))
        else:
            names.append(str(entry))
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return "+".join(name if count == 1 else f"{count}×{name}" for name, count in runs)


def config_keys(columns: Iterable[str], *, hashed_only: bool = False) -> list[str]:
    """The configuration columns among a record's (or a results frame's) `columns`, in order.

    They are the aliases, the resolved keys (`device`, `threads`, `shared_qk`), and every
    flattened config key: the columns with a dot (a measurement's name never has one; an
    `@<label>` evaluation column is a measurement). Left out: the keys an alias or a resolved
    key stands for, the sweep's bookkeeping (`sweep`, `resume`, `fail_on`, `report`,
    `train.progress`), and with `hashed_only` also `budget.*`, which decides whether a
    measurement completes but not what it measures (as in `config_hash`), and `lr_source`,
    which says where train.lr came from (the rate itself is hashed). Top-level preset keys
    without a dot (a preset's `train_as` label) are not recognised.
    """
    aliased = {*ALIASES.values(), *RESOLVED.values()} - {*ALIASES, *RESOLVED}
    left_out = ("budget",) if hashed_only else ()
    keys = []
    for column in columns:
        if hashed_only and column == "lr_source":
            continue
        if column in ALIASES or column in RESOLVED:
            keys.append(column)
        elif "." in column and "@" not in column and column not in aliased:
            if not _is_under(column, (*_BOOKKEEPING, *left_out)):
                keys.append(column)
    return keys


def _is_under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def _json_safe(record: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities are not JSON; a value that is not a number is recorded as null."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()
    }


def write_json_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write `record` to `path` so a reader never sees a partial file (tmp file + rename)."""

    def dump(tmp: Path) -> None:
        with open(tmp, "w") as f:
            json.dump(_json_safe(record), f, indent=1, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())

    write_atomic(path, dump)
