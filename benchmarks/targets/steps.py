"""One training step per process, the rows of `--million` and `--reformer`.

`--million` and `--reformer` print only their own tables, each row one training step (forward
and backward of the LM loss, no optimiser step) run in a fresh process, so that its peak RSS
is the row's own. Both use the memory switches `model.ff_chunks`, `model.loss_chunks` and
`model.attention_chunks` (MILLION_SWITCHES); LSH's window masks at 2^20 exceed
`lsh.masks.MASK_BYTES` and are rebuilt per slice and round.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from benchmarks.targets.kernels import BATCH, model_config
from experiments.measurement.memory import peak_rss_bytes
from experiments.records.files import write_atomic
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


OnRow = Callable[[StepRow], None] | None  # told of each row as it ends


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
    if done.returncode < 0:  # SIGKILL with no output: on Linux, the OOM killer's way
        error = f"killed by signal {-done.returncode}; {error}"
    return StepRow(name, note=f"failed (exit {done.returncode}): {error}")


def describe(row: StepRow) -> str:
    if row.seconds is None:
        return row.note
    cpu = f" (CPU {row.cpu_seconds:.0f} s)" if row.cpu_seconds is not None else ""
    return f"{row.seconds:.0f} s{cpu}, peak RSS {row.peak_rss_bytes / 1e9:.2f} GB"


def step_markdown(rows: list[StepRow]) -> str:
    """The rows as a Markdown table: step, wall and CPU seconds, peak RSS, bound and met (or
    why the row has no step)."""
    lines = [
        "| step | seconds | CPU seconds | peak RSS GB | bound | met |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        if row.seconds is None:
            lines.append(f"| {row.name} | | | | | {row.note} |")
            continue
        bound = met = ""
        if row.bound_bytes is not None:
            bound = f"< {row.bound_bytes / 1e9:.0f} GB"
            met = "yes" if row.peak_rss_bytes < row.bound_bytes else "NO"
        gb = row.peak_rss_bytes / 1e9
        cpu = "" if row.cpu_seconds is None else f"{row.cpu_seconds:.0f}"
        lines.append(f"| {row.name} | {row.seconds:.0f} | {cpu} | {gb:.2f} | {bound} | {met} |")
    return "\n".join(lines)


def print_step_table(rows: list[StepRow]) -> None:
    print("\n" + step_markdown(rows))


STEP_COLUMNS = [f.name for f in fields(StepRow)]


def write_step_csv(path: Path, rows: list[StepRow], run: Mapping[str, object]) -> None:
    """The rows at `path` as CSV (StepRow's fields, unrounded; empty where a row has none),
    then the `run`'s columns (threads, commit, day), the same on every row. Written whole
    each time (`write_atomic`: a run stopped mid-write keeps the file of the rows before), so a
    run that writes after every row keeps the rows that ended."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([*STEP_COLUMNS, *run])
            for row in rows:
                values = ["" if v is None else v for v in asdict(row).values()]
                writer.writerow([*values, *run.values()])

    write_atomic(path, write)


def read_step_csv(path: Path) -> tuple[list[StepRow], dict[str, str]]:
    """The rows `write_step_csv` wrote, and its run's columns: each column's distinct values
    in row order, comma-separated (rows of several runs, each with its commit, can share a
    file)."""
    with open(path, newline="") as file:
        lines = list(csv.DictReader(file))
    if not lines:
        raise ValueError(f"{path} holds no step rows")

    def number(text: str, kind: type) -> float | int | None:
        return None if text == "" else kind(float(text))

    rows = [
        StepRow(
            x["name"],
            number(x["seconds"], float),
            number(x["peak_rss_bytes"], int),
            number(x["cpu_seconds"], float),
            number(x["bound_bytes"], int),
            x["note"],
        )
        for x in lines
    ]
    run = {
        k: ", ".join(dict.fromkeys(x[k] for x in lines)) for k in lines[0] if k not in STEP_COLUMNS
    }
    return rows, run


def is_step_csv(path: Path) -> bool:
    """Whether the CSV at `path` holds step rows (its header starts with StepRow's fields)."""
    with open(path, newline="") as file:
        header = next(csv.reader(file), [])
    return header[: len(STEP_COLUMNS)] == STEP_COLUMNS
