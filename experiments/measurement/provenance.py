"""Where and with what a record was measured: the machine facts of its provenance columns.

The columns themselves (names, types, docs) are the record schema's
(experiments/records/record.py, part `provenance`); this module reads their values from the
running process and machine, so the schema floor imports nothing above it.
"""

from __future__ import annotations

import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.measurement import allocator

if TYPE_CHECKING:  # imported inside `provenance`, so importing this module starts no torch
    import torch


def provenance(device: torch.device | None = None) -> dict[str, Any]:
    """Where and with what a record was measured."""
    import torch

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
        "thp_mem_alloc": allocator.thp_mem_alloc(),
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
