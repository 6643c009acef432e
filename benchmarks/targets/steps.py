"""One training step per process, the rows of `--million` and `--reformer`.

`--million` and `--reformer` print only their own tables, each row one training step (forward
and backward of the LM loss, no optimiser step) run in a fresh process, so that its peak RSS
is the row's own. Both use the memory switches `model.ff_chunks`, `model.loss_chunks` and
`model.attention_chunks` (MILLION_SWITCHES); LSH's window masks at 2^20 exceed
`lsh.masks.MASK_BYTES` and are rebuilt per slice and round.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.targets.kernels import BATCH, model_config
from experiments.measurement.memory import peak_rss_bytes
from variants import TransformerLM

# The memory switches of every step row, as ModelConfig fields.
MILLION_SWITCHES = {"ff_chunks": 16, "loss_chunks": 16, "attention_chunks": 4}
ROW_PREFIX = "STEP-ROW "


@dataclass
class StepRow:
    """One training step: its wall time, the CPU time of its process (every thread; on a shared
    machine the wall time also counts waiting for a core, the CPU time does not) and the
    process's peak RSS, or why it has none."""

    name: str
    seconds: float | None = None
    peak_rss_bytes: int | None = None
    cpu_seconds: float | None = None
    bound_bytes: int | None = None
    note: str = ""


def step_row(attention: str, length: str, depth: str, block: str, d_model: str) -> dict:
    """Build the model, run one training step (forward and backward of the chunked LM loss,
    no optimiser step) and return its wall and CPU seconds and this process's peak RSS."""
    config = model_config(attention, int(length), int(depth), block, MILLION_SWITCHES, int(d_model))
    net = TransformerLM(config)
    tokens = torch.randint(0, 256, (BATCH, int(length) + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    everywhere = torch.ones_like(inputs, dtype=torch.bool)
    start, cpu_start = time.perf_counter(), time.process_time()
    net.loss(inputs, targets, everywhere).backward()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": peak_rss_bytes()}


def run_step_row(
    name: str, attention: str, length: int, depth: int, block: str, d_model: int
) -> StepRow:
    """`step_row` in a fresh process (`python -m benchmarks.targets --step-row`), so the peak
    RSS is its own; a failed process (e.g. killed for memory) gives a row with its exit
    status."""
    spec = f"{attention}:{length}:{depth}:{block}:{d_model}"
    command = [sys.executable, "-m", "benchmarks.targets", "--step-row", spec]
    command += ["--threads", str(torch.get_num_threads())]
    done = subprocess.run(command, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(ROW_PREFIX):
            row = json.loads(line.removeprefix(ROW_PREFIX))
            return StepRow(name, row["seconds"], row["peak_rss_bytes"], row.get("cpu_seconds"))
    error = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return StepRow(name, note=f"failed (exit {done.returncode}): {error}")


def describe(row: StepRow) -> str:
    if row.seconds is None:
        return row.note
    cpu = f" (CPU {row.cpu_seconds:.0f} s)" if row.cpu_seconds is not None else ""
    return f"{row.seconds:.0f} s{cpu}, peak RSS {row.peak_rss_bytes / 1e9:.2f} GB"


def print_step_table(rows: list[StepRow]) -> None:
    print("\n| step | seconds | CPU seconds | peak RSS GB | bound | met |")
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        if row.seconds is None:
            print(f"| {row.name} | | | | | {row.note} |")
            continue
        bound = met = ""
        if row.bound_bytes is not None:
            bound = f"< {row.bound_bytes / 1e9:.0f} GB"
            met = "yes" if row.peak_rss_bytes < row.bound_bytes else "NO"
        gb = row.peak_rss_bytes / 1e9
        cpu = "" if row.cpu_seconds is None else f"{row.cpu_seconds:.0f}"
        print(f"| {row.name} | {row.seconds:.0f} | {cpu} | {gb:.2f} | {bound} | {met} |")
