"""The performance targets of the efficient variants, measured and printed as one table.

    python -m benchmarks.targets                 # 4K..32K, memory at 64K, depth ratios
    python -m benchmarks.targets --max-len 8192  # a quick subset
    python -m benchmarks.targets --lengths 512,1024 --kernels linear,blockwise --heads 8 \
        --skip-flex --skip-memory --skip-depth --skip-decode --csv targets.csv
    python -m benchmarks.targets --million --csv m.csv  # a 2^20-token step per O(L) variant
    python -m benchmarks.targets --reformer      # 12 LSH layers at 64K, reversible vs residual
    python -m benchmarks.targets --table docs/results/selection_targets.csv  # a CSV's table

Every contender (SDPA included) runs with PyTorch's transparent-huge-page allocations
(THP_MEM_ALLOC_ENABLE=1, set by the `benchmarks` package before torch starts unless the
environment sets it; `THP_MEM_ALLOC_ENABLE=0` measures without); the first line says which.
The kernel rows measure at --batch, --heads, --head-dim, --dtype and --device (default 1, 4, 64,
float32, cpu: the shape the bounds were set at); `--csv PATH` also writes the table and the run
(shape, threads, commit, day) there, which `--table PATH` prints again without measuring.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

import torch

from benchmarks.targets.call_timing import YARDSTICK
from benchmarks.targets.decode import DECODE_LENGTH, decode_targets
from benchmarks.targets.flex_compare import FLEX_MAX_LENGTH, flex_targets
from benchmarks.targets.kernels import HEAD_DIM, HEADS, Shape, kernel_settings, measured_at
from benchmarks.targets.million import MILLION_LENGTH, million_rows
from benchmarks.targets.reformer import REFORMER_LENGTH, reformer_rows
from benchmarks.targets.reversible_depth import depth_targets
from benchmarks.targets.speed import LENGTHS, kernel_targets, time_kernels
from benchmarks.targets.step_memory import MEMORY_LENGTH, memory_targets
from benchmarks.targets.steps import (
    ROW_PREFIX,
    StepRow,
    is_step_csv,
    print_step_table,
    read_step_csv,
    step_markdown,
    step_row,
    write_step_csv,
)
from benchmarks.targets.table import Target, markdown, print_table, read_csv, write_csv
from experiments.measurement.provenance import git_commit
from experiments.measurement.timing import matmul_gflops_per_s
from variants import attention_names


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table is not None:
        print(saved_table(args.table))
        return
    torch.set_num_threads(args.threads)
    if args.step_row:
        print(ROW_PREFIX + json.dumps(step_row(*args.step_row.split(":"))), flush=True)
        return
    if args.million or args.reformer:
        run_steps(args)
        return
    with measured_at(args.shape):
        targets = measure(args)
    print_table(targets)
    if args.csv is not None:
        at = args.shape
        run = {
            "batch": at.batch,
            "heads": at.heads,
            "head_dim": at.head_dim,
            "dtype": str(at.dtype).removeprefix("torch."),
            "device": at.device.type,
            **provenance(),
        }
        write_csv(args.csv, targets, run)
        print(f"wrote {len(targets)} rows to {args.csv}")


def provenance() -> dict[str, object]:
    """The columns every CSV row of a run carries: threads, commit and day."""
    return {
        "threads": torch.get_num_threads(),
        "commit": git_commit(),
        "date": datetime.date.today().isoformat(),
    }


def saved_table(path: Path) -> str:
    """The run line and table of a CSV that `--csv` wrote (target or step rows)."""
    try:
        if is_step_csv(path):
            steps, run = read_step_csv(path)
            table = step_markdown(steps)
        else:
            targets, run = read_csv(path)
            table = markdown(targets)
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"--table {path}: not a targets CSV ({error!r})") from None
    return ", ".join(f"{k} {v}" for k, v in run.items()) + "\n\n" + table


def run_steps(args: argparse.Namespace) -> None:
    """The `--million` and `--reformer` rows, one process each; with `--csv`, the file is
    written again after every row, so a run stopped midway keeps the rows that ended."""
    rows: list[StepRow] = []
    run = provenance()

    def keep(row: StepRow) -> None:
        rows.append(row)
        if args.csv is not None:
            write_step_csv(args.csv, rows, run)

    if args.million:
        million_rows(args.million_len, args.kernels, keep)
    if args.reformer:
        reformer_rows(args.reformer_len, args.reformer_d_model, keep)
    print_step_table(rows)
    if args.csv is not None:
        print(f"wrote {len(rows)} rows to {args.csv}")


def measure(args: argparse.Namespace) -> list[Target]:
    """The target rows of a run at `args.shape` (the kernel timings, then the other targets
    not skipped), each length's timings printed as it ends."""
    at = args.shape
    rate = matmul_gflops_per_s(at.device.type, at.dtype, YARDSTICK)
    dtype = str(at.dtype).removeprefix("torch.")
    print(
        f"batch {at.batch}, heads {at.heads}, head_dim {at.head_dim}, {dtype} on {at.device}; "
        f"threads {torch.get_num_threads()}, {dtype} matmul {rate:.0f} GFLOP/s at start "
        "(FLOP fractions use the matmul timed around each call), "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}, "
        f"at least {args.rounds} rounds and {args.min_seconds:g} s per length"
    )
    names = args.kernels.split(",") if args.kernels else None
    timings = {}
    for length in args.lengths:
        timings[length] = measured = time_kernels(length, args.rounds, args.min_seconds, names)
        print(
            f"L={length} ({measured.rounds} rounds): speed-up over SDPA "
            + ", ".join(f"{k} {v:.2f}x" for k, v in measured.speedups.items())
            + f"; seconds {', '.join(f'{k} {v:.3g}' for k, v in measured.seconds.items())}",
            flush=True,
        )
    targets = kernel_targets(timings, args.lengths)
    if not args.skip_flex:
        flex_lengths = [n for n in args.lengths if n <= args.flex_max_len]
        targets += flex_targets(flex_lengths, args.rounds, args.min_seconds)
    if not args.skip_memory:
        targets += memory_targets(args.memory_len, names)
    if not args.skip_depth:
        targets += depth_targets(args.depth_len, args.depth_attention, args.rounds)
    if not args.skip_decode:
        targets += decode_targets(args.decode_len, args.rounds)
    return targets


DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DEVICES = ("auto", "cpu", "cuda")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (the flag and its constraint), not the
    usage block first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _lengths(text: str) -> list[int]:
    """A comma-separated list of positive integers, sorted, each once."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of positive integers, got {text!r}"
        )
    return sorted(set(values))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked: an invalid one exits with one line naming it and its constraint.
    Adds `shape` (`kernels.Shape`) and resolves `lengths` (--max-len applied)."""
    # argparse would name the package's `__main__.py`; the command is what a user types.
    parser = _Parser(prog="python -m benchmarks.targets", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        type=_lengths,
        default=list(LENGTHS),
        help="comma-separated kernel lengths (default %(default)s; scaling exponents need two)",
    )
    parser.add_argument(
        "--max-len", type=_positive_int, help="drop the --lengths above this (a quick subset)"
    )
    parser.add_argument("--batch", type=_positive_int, default=Shape.batch)
    parser.add_argument("--heads", type=_positive_int, default=Shape.heads)
    parser.add_argument("--head-dim", type=_positive_int, default=Shape.head_dim)
    parser.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    parser.add_argument("--device", default="cpu", help="auto (cuda if available), cpu or cuda")
    parser.add_argument(
        "--csv",
        type=Path,
        help="also write the target table to this CSV file: one row per target, with the "
        "run's shape (with --million or --reformer: their step rows, after every row)",
    )
    parser.add_argument(
        "--table",
        type=Path,
        help="measure nothing: print the run and the table of a CSV written by --csv",
    )
    parser.add_argument(
        "--rounds",
        type=_positive_int,
        default=3,
        help="timing rounds (median taken): the least per kernel length, exactly this many "
        "for the depth ratios",
    )
    parser.add_argument(
        "--min-seconds",
        type=_non_negative_float,
        default=60.0,
        help="keep adding rounds at a length until this many seconds are spent on it",
    )
    parser.add_argument("--threads", type=_positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--kernels", help="comma-separated registry variants (default: all)")
    parser.add_argument("--memory-len", type=_positive_int, default=MEMORY_LENGTH)
    parser.add_argument(
        "--depth-len", type=_positive_int, default=4096, help="seq_len of depth ratios"
    )
    parser.add_argument("--depth-attention", default="lsh")
    parser.add_argument(
        "--flex-max-len",
        type=_positive_int,
        default=FLEX_MAX_LENGTH,
        help="longest length of the forward comparison with compiled FlexAttention",
    )
    parser.add_argument("--skip-flex", action="store_true", help="no FlexAttention rows")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-depth", action="store_true")
    parser.add_argument("--skip-decode", action="store_true", help="no decoding rows")
    parser.add_argument(
        "--decode-len", type=_positive_int, default=DECODE_LENGTH, help="longest decoding context"
    )
    parser.add_argument(
        "--million", action="store_true", help="only the 2^20-token training step per variant"
    )
    parser.add_argument("--million-len", type=_positive_int, default=MILLION_LENGTH)
    parser.add_argument(
        "--reformer", action="store_true", help="only 12 reversible vs residual LSH layers"
    )
    parser.add_argument("--reformer-len", type=_positive_int, default=REFORMER_LENGTH)
    parser.add_argument("--reformer-d-model", type=_positive_int, default=HEADS * HEAD_DIM)
    parser.add_argument("--step-row", help=argparse.SUPPRESS)  # one row, in its own process
    args = parser.parse_args(argv)
    _check(parser, args)
    return args


def _check(parser: _Parser, args: argparse.Namespace) -> None:
    """The checks across flags and against the registry and the machine; sets `args.shape`."""
    if args.max_len is not None:
        kept = [n for n in args.lengths if n <= args.max_len]
        if not kept:
            parser.error(
                f"argument --max-len: {args.max_len} is below every length of --lengths "
                f"({','.join(map(str, args.lengths))}); give shorter --lengths"
            )
        args.lengths = kept
    if args.dtype not in DTYPES:
        parser.error(f"argument --dtype: must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.device not in DEVICES:
        parser.error(f"argument --device: must be one of {', '.join(DEVICES)}, got {args.device!r}")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda, but torch sees no CUDA device on this machine")
    if args.kernels is not None:
        known = list(kernel_settings())
        unknown = [name for name in args.kernels.split(",") if name not in known]
        if unknown:
            parser.error(
                f"argument --kernels: unknown kernel {unknown[0]!r}; known: {', '.join(known)}"
            )
    if args.depth_attention not in attention_names():
        parser.error(
            f"argument --depth-attention: unknown variant {args.depth_attention!r}; known: "
            + ", ".join(attention_names())
        )
    if args.csv is not None and not args.csv.parent.is_dir():
        parser.error(f"argument --csv: folder {str(args.csv.parent)!r} does not exist")
    args.shape = Shape(
        args.batch, args.heads, args.head_dim, DTYPES[args.dtype], torch.device(device)
    )


if __name__ == "__main__":
    main()
