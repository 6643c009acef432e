"""One job's record: a flat dict of documented columns, its identity and its provenance.

Columns carry their unit in the name (`_ms`, `_bytes`, `_per_s`). Configuration columns come from
the resolved Hydra config, flattened with dots (`attention.n_hashes`, `model.depth`); the
short aliases `attention`, `block`, `task`, `seq_len`, ... are the ones analysis groups by.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

STATUSES = ("ok", "oom", "timeout", "skipped", "error", "diverged")

# Keys of the resolved config that do not change what is measured, so they stay out of the hash.
# A budget decides whether a measurement completes, not what it measures: re-running an oom
# configuration with a larger budget replaces its record.
_BOOKKEEPING = ("logger", "sweep", "resume", "fail_on", "train.progress")
_UNHASHED = (*_BOOKKEEPING, "budget")

# The short names analysis groups by, and the resolved config key each one stands for.
ALIASES = {
    "attention": "attention.name",
    "block": "block.name",
    "task": "task.name",
    "seq_len": "seq_len",
    "batch_size": "batch_size",
    "d_model": "model.d_model",
    "n_heads": "model.n_heads",
    "depth": "model.depth",
    "causal": "model.causal",
    "dtype": "dtype",
    "seed": "seed",
}
# Config keys a job resolves and records as it ran (device auto -> cpu, threads null -> n,
# model.shared_qk null -> as the variant requires), and the key each one stands for.
RESOLVED = {"device": "device", "threads": "threads", "shared_qk": "model.shared_qk"}


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
    flat = {k: v for k, v in flatten(config).items() if not _is_under(k, _UNHASHED)}
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_columns(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration part of a record: short aliases plus every flattened config key."""
    flat = flatten(config)
    columns = {alias: flat[key] for alias, key in ALIASES.items()}
    # Every other resolved key too (e.g. a preset's `train_as`, `eval.attention.*`), so a
    # record says everything that made it; the logger's settings are not measurement.
    for key, value in flat.items():
        if not key.startswith("logger."):
            columns.setdefault(key, value)
    return columns


def config_keys(columns: Iterable[str], *, hashed_only: bool = False) -> list[str]:
    """The configuration columns among a record's (or a results frame's) `columns`, in order.

    They are the aliases, the resolved keys (`device`, `threads`, `shared_qk`), and every
    flattened config key: the columns with a dot (a measurement's name never has one; an
    `@<label>` evaluation column is a measurement). Left out: the keys an alias or a resolved
    key stands for, the sweep's bookkeeping (`sweep`, `resume`, `fail_on`, `train.progress`),
    and with `hashed_only` also `budget.*`, which decides whether a measurement completes but
    not what it measures (as in `config_hash`). Top-level preset keys without a dot (a preset's
    `train_as` label) are not recognised.
    """
    aliased = {*ALIASES.values(), *RESOLVED.values()} - {*ALIASES, *RESOLVED}
    left_out = ("budget",) if hashed_only else ()
    keys = []
    for column in columns:
        if column in ALIASES or column in RESOLVED:
            keys.append(column)
        elif "." in column and "@" not in column and column not in aliased:
            if not _is_under(column, (*_BOOKKEEPING, *left_out)):
                keys.append(column)
    return keys


def _is_under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def provenance(device: torch.device | None = None) -> dict[str, Any]:
    """Where and with what a record was measured."""
    if device is not None and device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = cpu_name()
    return {
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "device_name": device_name,
        "hostname": socket.gethostname(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """HEAD of the checkout this code runs from, with `+dirty` if it has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        commit = head.stdout.strip() if head.returncode == 0 else ""
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}+dirty" if commit and dirty else (commit or "unknown")


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


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Create or replace `path` whole: `write(tmp)` writes a file beside it, which is then
    renamed over it, so a reader never sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; follow the umask like any other file
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
