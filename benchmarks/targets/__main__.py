"""The performance targets of the efficient variants, measured and printed as one table.

    python -m benchmarks.targets                 # 4K..32K, memory at 64K, depth ratios
    python -m benchmarks.targets --max-len 8192  # a quick subset
    python -m benchmarks.targets --million       # one 2^20-token training step per O(L) variant
    python -m benchmarks.targets --reformer      # 12 LSH layers at 64K, reversible vs residual

Every contender (SDPA included) runs with PyTorch's transparent-huge-page allocations
(THP_MEM_ALLOC_ENABLE=1, set by the `benchmarks` package before torch starts unless the
environment sets it; `THP_MEM_ALLOC_ENABLE=0` measures without); the first line says which.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from benchmarks.targets.call_timing import YARDSTICK
from benchmarks.targets.decode import DECODE_LENGTH, decode_targets
from benchmarks.targets.flex_compare import FLEX_MAX_LENGTH, flex_targets
from benchmarks.targets.kernels import HEAD_DIM, HEADS, KERNELS
from benchmarks.targets.million import MILLION_LENGTH, million_rows
from benchmarks.targets.reformer import REFORMER_LENGTH, reformer_rows
from benchmarks.targets.reversible_depth import depth_targets
from benchmarks.targets.speed import LENGTHS, kernel_targets, time_kernels
from benchmarks.targets.step_memory import MEMORY_LENGTH, memory_targets
from benchmarks.targets.steps import ROW_PREFIX, print_step_table, step_row
from benchmarks.targets.table import print_table
from experiments.measurement.timing import matmul_gflops_per_s


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.step_row:
        print(ROW_PREFIX + json.dumps(step_row(*args.step_row.split(":"))), flush=True)
        return
    if args.million or args.reformer:
        rows = million_rows(args.million_len, args.kernels) if args.million else []
        rows += reformer_rows(args.reformer_len, args.reformer_d_model) if args.reformer else []
        print_step_table(rows)
        return
    lengths = [n for n in LENGTHS if n <= args.max_len]
    rate = matmul_gflops_per_s("cpu", torch.float32, YARDSTICK)
    print(
        f"threads {torch.get_num_threads()}, fp32 matmul {rate:.0f} GFLOP/s at start "
        "(FLOP fractions use the matmul timed around each call), "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}, "
        f"at least {args.rounds} rounds and {args.min_seconds:g} s per length"
    )
    names = args.kernels.split(",") if args.kernels else list(KERNELS)
    unknown = sorted(set(names) - set(KERNELS))
    if unknown:
        raise SystemExit(f"--kernels: unknown {unknown[0]!r}; known: {', '.join(KERNELS)}")
    timings = {}
    for length in lengths:
        timings[length] = measured = time_kernels(length, args.rounds, args.min_seconds, names)
        print(
            f"L={length} ({measured.rounds} rounds): speed-up over SDPA "
            + ", ".join(f"{k} {v:.2f}x" for k, v in measured.speedups.items())
            + f"; seconds {', '.join(f'{k} {v:.3g}' for k, v in measured.seconds.items())}",
            flush=True,
        )
    targets = kernel_targets(timings, lengths)
    if not args.skip_flex:
        flex_lengths = [n for n in lengths if n <= args.flex_max_len]
        targets += flex_targets(flex_lengths, args.rounds, args.min_seconds)
    if not args.skip_memory:
        targets += memory_targets(args.memory_len, names)
    if not args.skip_depth:
        targets += depth_targets(args.depth_len, args.depth_attention, args.rounds)
    if not args.skip_decode:
        targets += decode_targets(args.decode_len, args.rounds)
    print_table(targets)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # argparse would name the package's `__main__.py`; the command is what a user types.
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.targets", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--max-len", type=int, default=LENGTHS[-1], help="longest kernel length")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timing rounds (median taken): the least per kernel length, exactly this many "
        "for the depth ratios",
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=60.0,
        help="keep adding rounds at a length until this many seconds are spent on it",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--kernels", help="comma-separated registry variants (default: all)")
    parser.add_argument("--memory-len", type=int, default=MEMORY_LENGTH)
    parser.add_argument("--depth-len", type=int, default=4096, help="seq_len of depth ratios")
    parser.add_argument("--depth-attention", default="lsh")
    parser.add_argument(
        "--flex-max-len",
        type=int,
        default=FLEX_MAX_LENGTH,
        help="longest length of the forward comparison with compiled FlexAttention",
    )
    parser.add_argument("--skip-flex", action="store_true", help="no FlexAttention rows")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-depth", action="store_true")
    parser.add_argument("--skip-decode", action="store_true", help="no decoding rows")
    parser.add_argument(
        "--decode-len", type=int, default=DECODE_LENGTH, help="longest decoding context"
    )
    parser.add_argument(
        "--million", action="store_true", help="only the 2^20-token training step per variant"
    )
    parser.add_argument("--million-len", type=int, default=MILLION_LENGTH)
    parser.add_argument(
        "--reformer", action="store_true", help="only 12 reversible vs residual LSH layers"
    )
    parser.add_argument("--reformer-len", type=int, default=REFORMER_LENGTH)
    parser.add_argument("--reformer-d-model", type=int, default=HEADS * HEAD_DIM)
    parser.add_argument("--step-row", help=argparse.SUPPRESS)  # one row, in its own process
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
