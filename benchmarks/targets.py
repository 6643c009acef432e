"""The performance targets of the efficient variants, measured and printed as one table.

    python -m benchmarks.targets                 # 4K..32K, memory at 64K, depth ratios
    python -m benchmarks.targets --max-len 8192  # a quick subset
    python -m benchmarks.targets --million       # one 2^20-token training step per O(L) variant
    python -m benchmarks.targets --reformer      # 12 LSH layers at 64K, reversible vs residual

Kernel timings are forward+backward (gradients of q, k, v) at batch 1, 4 heads, head_dim 64,
fp32, causal (Linformer cannot be causal and runs unmasked), all against a bare
`F.scaled_dot_product_attention(q, k, v, is_causal=True)` call. The machine is shared and its
speed drifts, so every length is measured in rounds that time each contender once, and a
variant's speed-up is the median over rounds of SDPA's time / its time in the same round, and
its FLOP fraction the median of its useful FLOP/s over the rate of a 1024^3 matmul timed just
before and just after it.
Every contender (SDPA included) runs with PyTorch's transparent-huge-page allocations
(THP_MEM_ALLOC_ENABLE=1, set by the `benchmarks` package before torch starts unless the
environment sets it; `THP_MEM_ALLOC_ENABLE=0` measures without); the first line says which.

With the optional extra `compare` installed (`pip install -e '.[compare]'`), the public
implementations are timed in the same rounds at the same settings, causal: reformer-pytorch's
`LSHAttention` (n_hashes 4, bucket_size 64; target "lsh >= 3x faster" at 32K),
routing-transformer's `KmeansAttention` (window 128, L / 128 clusters, shared QK) and
performer-pytorch's `FastAttention` (266 features; targets "routing and performer faster" at
16K). `--kernels` restricts the registry variants timed (SDPA always runs).

The combined presets (`longformer`, `bigbird`) are also timed against `blockwise` with the same
number of key blocks per query block, and every fixed pattern's forward (no grad) against
compiled FlexAttention with the block mask of the same pattern (`impl=flex`, up to
`--flex-max-len`; each length and pattern compiles once, ~30 s, in the untimed first call).

Decoding (`--skip-decode` to leave out; `experiments.measurement.decode.measure_decode`, the same
measurement as `measure.decode`): exact attention's per-token read of its cache at 64K as a
fraction of the copy bandwidth (>= 0.5), linear, Performer and DeltaNet's ms/token flat from
1K to 64K (within 1.5x: a fixed state), and the window caches (blockwise, longformer) no larger
at 64K than at 4K.

`--million` and `--reformer` print only their own tables, each row one training step (forward
and backward of the LM loss, no optimiser step) run in a fresh process, so that its peak RSS
is the row's own: one layer at 2^20 tokens per O(L) variant (bound 16 GB), and a 12-layer LSH
model at 64K tokens with reversible and residual blocks. Both use the memory switches
`model.ff_chunks`, `model.loss_chunks` and `model.attention_chunks` (MILLION_SWITCHES); LSH's
window masks at 2^20 exceed `lsh.masks.MASK_BYTES` and are rebuilt per slice and round.

The project's own parts measure: kernels and models are built from one `variants.ModelConfig`
(d_model 256, 4 heads) as a model's layers build them, each call is timed by
`experiments.measurement.timing.time_call`, the yardstick is
`experiments.measurement.timing.matmul_call`, peak memory is
`experiments.measurement.memory.peak_memory_bytes` and exponents are `analysis.fit.fit_power_law`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from analysis.fit import fit_power_law
from experiments.measurement import timing
from experiments.measurement.decode import measure_decode
from experiments.measurement.memory import peak_memory_bytes, peak_rss_bytes
from experiments.measurement.timing import matmul_call, matmul_gflops_per_s, time_call
from variants import ModelConfig, TransformerLM, build_attention
from variants.attention.common.base import FWD_BWD_FLOP_FACTOR, sample_gates
from variants.layers import build_kernel

BATCH, HEADS, HEAD_DIM = 1, 4, 64
CPU = torch.device("cpu")
YARDSTICK = 1024  # the matmul timed around each call: YARDSTICK^3, fp32
# The length the 32K targets (speed-ups, FLOP rate, reformer-pytorch) are judged at.
TARGET_LENGTH = 32768
LENGTHS = (4096, 8192, 16384, TARGET_LENGTH)
# The kernel settings the targets name; everything else at its registry default.
KERNELS = {
    "full": {},
    "lsh": {"n_hashes": 4, "bucket_size": 64},
    "blockwise": {"block_size": 128, "look_backward": 1},
    "strided": {"stride": "auto"},
    "compressed": {},
    "linformer": {},
    # n_clusters = L / window at each length (see `kernel`): clusters x window = L, the rule of
    # the reference code's configurations, which routing-transformer's layout requires.
    "routing": {"window": 128},
    "performer": {},
    "linear": {},
    "longformer": {},  # presets at their published shapes; one seed for the random blocks
    "bigbird": {"seed": 0},
    "sparse_fixed": {},
    # blockwise with as many key blocks per query block as the preset's causal pattern:
    # longformer own + 2 back + the global token's block; bigbird own + 1 back + the global
    # block + 3 random blocks.
    "blockwise-4x128": {"variant": "blockwise", "block_size": 128, "look_backward": 3},
    "blockwise-6x64": {"variant": "blockwise", "block_size": 64, "look_backward": 5},
    # Trainable block selection and the delta rule, at their registry defaults (gated kernels
    # get sigmoid(N(0, 1)) gates, as `base.sample_gates`).
    "moba": {},
    "nsa": {},
    "deltanet": {},
}
ROUTING_WINDOW = KERNELS["routing"]["window"]
# Each combined preset and the blockwise kernel with its number of key blocks per query block.
SAME_BLOCKS = {"longformer": "blockwise-4x128", "bigbird": "blockwise-6x64"}
# Forward (no grad) of each fixed pattern, ours against compiled FlexAttention on its pattern.
FLEX_KERNELS = ("blockwise", "strided", "longformer", "bigbird", "sparse_fixed")
FLEX_MAX_LENGTH = 16384
MEMORY_LENGTH = 65536
MEMORY_KERNELS = (
    "lsh",
    "blockwise",
    "strided",
    "linformer",
    "routing",
    "performer",
    "linear",
    "longformer",
    "bigbird",
    "moba",
    "nsa",
    "deltanet",
)
MEMORY_INFO_KERNELS = ("compressed",)  # measured alongside, without a bound
MEMORY_LIMIT_BYTES = 4 * 10**9  # the target says 4 GB: 3.73 GiB
GiB = 2**30
# One training step at 2^20 tokens per O(L) variant, each in its own process (`--million`).
MILLION_LENGTH = 2**20
MILLION_KERNELS = (
    "blockwise",
    "lsh",
    "linear",
    "performer",
    "longformer",
    "bigbird",
    "routing",
    "moba",
    "nsa",
    "deltanet",
)
# Rows printed without a run, and why.
MILLION_NOT_RUN = {
    "sparse_fixed": "quadratic at 2^20: its summary columns give each query ~L/8 keys "
    "(~5e14 FLOP per step); not run",
}
MILLION_SWITCHES = {"ff_chunks": 16, "loss_chunks": 16, "attention_chunks": 4}
MILLION_LIMIT_BYTES = 16 * 10**9  # the target says 16 GB at 2^20 tokens
BEYOND_MILLION_LIMIT_BYTES = 20 * 10**9  # and 20 GB at 2^21 (blockwise, linear)


def million_bound(length: int) -> int:
    """The peak-RSS bound of a one-layer step at `length` tokens: 16 GB up to 2^20, 20 GB
    beyond."""
    return MILLION_LIMIT_BYTES if length <= MILLION_LENGTH else BEYOND_MILLION_LIMIT_BYTES


# The Reformer's rows (`--reformer`): 12 LSH layers at 64K, reversible against residual.
REFORMER_LENGTH = 65536
REFORMER_DEPTH = 12


@dataclass
class Target:
    """One row of the table: what was measured, its value and the bound it must meet."""

    name: str
    value: float
    bound: str
    met: bool | None  # None when the row is informational


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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


# --- kernels -----------------------------------------------------------------------------------


def model_config(
    name: str,
    length: int,
    depth: int = 1,
    block: str = "residual",
    switches: dict | None = None,
    d_model: int = HEADS * HEAD_DIM,
    **extra,
) -> ModelConfig:
    """The targets' model: d_model 256, 4 heads (head_dim 64), the kernel settings of KERNELS
    (`extra` on top), at most `length` tokens; causal, but Linformer, which cannot be.
    `switches`: further ModelConfig fields (the memory switches)."""
    options = kernel_options(name, length) | extra
    variant = options.pop("variant", name)
    return ModelConfig(
        **(switches or {}),
        vocab_size=256,
        d_model=d_model,
        n_heads=HEADS,
        depth=depth,
        max_seq_len=length,
        attention=variant,
        attention_options=options,
        block=block,
        causal=variant != "linformer",
    )


def kernel(name: str, length: int, **extra) -> torch.nn.Module:
    """The kernel of `name` as a layer of the targets' model (`model_config`) builds it."""
    return build_kernel(model_config(name, length, **extra))


def kernel_options(name: str, length: int) -> dict:
    """KERNELS[name], with routing's n_clusters = length / window (one cluster at least)."""
    options = dict(KERNELS[name])
    if name == "routing":
        options["n_clusters"] = max(1, length // ROUTING_WINDOW)
    return options


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The baseline: the bare fused call, no wrapper."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


REFORMER_PYTORCH = "reformer-pytorch"
ROUTING_TRANSFORMER = "routing-transformer"
PERFORMER_PYTORCH = "performer-pytorch"


def reformer_pytorch_lsh(length: int) -> Callable | None:
    """reformer-pytorch's LSHAttention at the `lsh` settings of KERNELS, causal, as an
    attend(q, k, v) on (B, H, L, D); None when the package is not installed. It takes shared
    qk and folds heads into the batch; its other options stay at its defaults (and do not
    depend on the length)."""
    try:
        from reformer_pytorch import LSHAttention
    except ImportError:
        return None
    module = LSHAttention(**KERNELS["lsh"], causal=True)

    def attend(q, k, v):
        batch, heads, length, head_dim = q.shape
        out, _, _ = module(q.flatten(0, 1), v.flatten(0, 1))  # (B*H, L, D)
        return out.view(batch, heads, length, head_dim)

    return attend


def routing_transformer_kmeans(length: int) -> Callable | None:
    """routing-transformer's KmeansAttention, causal, shared QK (keys are the queries, as our
    `routing`), window 128 and length / 128 clusters (its layout needs clusters x window = L),
    in training mode (it updates its centroids as ours does); None when not installed."""
    try:
        from routing_transformer.routing_transformer import KmeansAttention
    except ImportError:
        return None
    clusters = max(1, length // ROUTING_WINDOW)
    module = KmeansAttention(clusters, ROUTING_WINDOW, HEADS, HEAD_DIM, causal=True, shared_qk=True)

    def attend(q, k, v):
        out, _ = module(q, q, v)  # (B, H, L, D) and its commitment loss
        return out

    return attend


def performer_pytorch_favor(length: int) -> Callable | None:
    """performer-pytorch's FastAttention (FAVOR+ softmax kernel), causal, with our default
    number of features; None when not installed. Without its CUDA extension its causal path
    is its own chunked cumulative sum (and it says so when built)."""
    try:
        from performer_pytorch import FastAttention
    except ImportError:
        return None
    features = build_attention("performer").n_features
    return FastAttention(HEAD_DIM, nb_features=features, causal=True)


# Public implementation -> (our variant it is compared with, its builder).
PEERS = {
    REFORMER_PYTORCH: ("lsh", reformer_pytorch_lsh),
    ROUTING_TRANSFORMER: ("routing", routing_transformer_kmeans),
    PERFORMER_PYTORCH: ("performer", performer_pytorch_favor),
}


def forward_backward(attend: Callable, length: int) -> Callable[[], object]:
    """A call of attend(q, k, v) forward and backward to q, k, v, on fixed random inputs."""
    q, k, v = (torch.randn(BATCH, HEADS, length, HEAD_DIM, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(BATCH, HEADS, length, HEAD_DIM)
    gates = _gates(attend, q)

    def call():
        out = attend(q, k, v, **gates)  # (B, H, L, D)
        return torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)

    return call


def forward(attend: Callable, length: int) -> Callable[[], object]:
    """A call of attend(q, k, v) without autograd, on fixed random inputs."""
    q, k, v = (torch.randn(BATCH, HEADS, length, HEAD_DIM) for _ in range(3))
    gates = _gates(attend, q)

    @torch.no_grad()
    def call():
        return attend(q, k, v, **gates)

    return call


def _gates(attend: Callable, q: torch.Tensor) -> dict:
    """{"gates": sigmoid(N(0, 1))} for a gated registry kernel (NSA, DeltaNet), else {}."""
    if not getattr(attend, "n_gates", 0):
        return {}
    return {"gates": sample_gates(attend, q)}


def seconds_per_call(fn: Callable[[], object], min_time_s: float = 0.3) -> float:
    """Seconds of one call, timed for at least `min_time_s` (at least one call) after one
    untimed call: `experiments.measurement.timing.time_call` with one block at the least, so a call
    of seconds is timed once and a short one over blocks of calls (the median block).

    The untimed call matters for every contender alike: the first call after another kernel's
    measured up to 2x slower for allocation-heavy kernels (LSH at 16K: 2.2 s after an SDPA call,
    1.07 s after its own), as glibc hands freed memory back and fresh pages fault in again.
    """
    timing = time_call(fn, CPU, min_run_time_s=min_time_s, warmup=1, min_blocks=1)
    return timing.median_ms / 1e3


@dataclass
class Timings:
    """One length's measurements, each the median over rounds, by contender name."""

    speedups: dict[str, float]  # SDPA's time / the contender's, per round
    fractions: dict[str, float]  # useful FLOP/s / the rate of the matmul timed around it
    seconds: dict[str, float]  # per forward+backward call ("sdpa" and "matmul" included)
    matmuls: dict[str, float]  # time per call in units of the 1024^3 matmul timed around it
    over_peers: dict[str, float]  # a public implementation's time / our variant's, per round
    rounds: int
    over_same_blocks: dict[str, float]  # a SAME_BLOCKS preset's time / its blockwise's, per round


def time_kernels(
    length: int, rounds: int, min_seconds: float = 0.0, variants: list[str] | None = None
) -> Timings:
    """The registry `variants` (default all), SDPA, and the installed public implementations
    of those variants (PEERS), timed once per round in turn, each next to the matmul
    yardstick (see `time_in_rounds`)."""
    calls = {"sdpa": forward_backward(sdpa, length)}
    names = list(KERNELS) if variants is None else list(variants)
    calls |= {name: forward_backward(kernel(name, length), length) for name in names}
    peers = {}
    for peer, (ours, builder) in PEERS.items():
        if ours in names and (reference := builder(length)) is not None:
            peers[peer] = ours
            calls[peer] = forward_backward(reference, length)
    times, yardsticks = time_in_rounds(calls, rounds, matmul_call(YARDSTICK), min_seconds)
    speedups, fractions = {}, {}
    for name in [*names, *peers]:
        speedups[name] = timing.ratio(times["sdpa"], times[name]).median
        if name in peers:
            continue
        # Useful FLOPs of the pattern (the kernel's own count), forward+backward.
        flops = FWD_BWD_FLOP_FACTOR * kernel(name, length).flops(BATCH, HEADS, length, HEAD_DIM)
        pairs = zip(times[name], yardsticks[name], strict=True)
        fractions[name] = statistics.median(flops / t / (2 * YARDSTICK**3 / mm) for t, mm in pairs)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    seconds["matmul"] = statistics.median(mm for ms in yardsticks.values() for mm in ms)
    # In units of the matmul timed next to each call, so that the machine's drift between rounds
    # and lengths (other jobs come and go) cancels; the scaling exponents are fitted to these.
    matmuls = {
        name: statistics.median(t / mm for t, mm in zip(ts, yardsticks[name], strict=True))
        for name, ts in times.items()
    }
    versus = {peer: timing.ratio(times[peer], times[ours]).median for peer, ours in peers.items()}
    same_blocks = {
        name: timing.ratio(times[name], times[other]).median
        for name, other in SAME_BLOCKS.items()
        if name in times and other in times
    }
    return Timings(speedups, fractions, seconds, matmuls, versus, len(times["sdpa"]), same_blocks)


def time_in_rounds(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    yardstick: Callable[[], object],
    min_seconds: float = 0.0,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per call of every contender, once per round in turn, and of the yardstick around
    each: the geometric mean of its time just before and just after the contender's. At least
    `rounds` rounds, and more until `min_seconds` have passed: where rounds are cheap (4K: ~8 s)
    the medians get more of them. `full` and SDPA run the same kernel, yet their ratio's median
    over 3 rounds ranged 0.97-1.21 at 4K (7 groups of 3 of 21 rounds); over all 21 it was 1.02.

    The machine's speed drifts within a minute (LSH at 32K took 1.35-1.94 s in four profiles
    minutes apart, the matmul 131-166 GFLOP/s): a contender measured against one matmul per
    round took that drift into its FLOP fraction: at 32K, LSH's call came after `full`'s
    (16-18 s) and later contenders' up to ~50 s after that matmul.
    `experiments.measurement.timing.time_in_rounds`, each call timed by `seconds_per_call`.
    Returns (times, yardsticks), each {name: one value per round}.
    """
    return timing.time_in_rounds(
        calls,
        rounds,
        lambda fn: seconds_per_call(fn),  # looked up per call: tests substitute it
        yardstick=yardstick,
        min_seconds=min_seconds,
        clock=lambda: time.perf_counter(),
    )


def at_least(name: str, value: float, bound: float) -> Target:
    return Target(name, value, f">= {bound:g}", value >= bound)


def at_most(name: str, value: float, bound: float) -> Target:
    return Target(name, value, f"<= {bound:g}", value <= bound)


def info(name: str, value: float) -> Target:
    return Target(name, value, "", None)


# Faster than SDPA from this length on; at least this speed-up at TARGET_LENGTH.
FASTER_FROM = {"lsh": 4096, "routing": 8192, "performer": 4096, "linear": 4096}
SPEEDUP_AT_TARGET = {
    "lsh": 8,
    "blockwise": 25,
    "routing": 5,
    "performer": 5,
    "linear": 5,
    "longformer": 10,
    "bigbird": 10,
    "moba": 5,
    "nsa": 3,
    "deltanet": 5,
}
EXPONENT_BOUNDS = {
    "blockwise": 1.15,
    "lsh": 1.15,
    "linformer": 1.15,
    "performer": 1.15,
    "linear": 1.15,
    "strided": 1.6,
    "routing": 1.6,
    "longformer": 1.15,
    "bigbird": 1.15,
    "moba": 1.15,
    "nsa": 1.15,
    "deltanet": 1.15,
}
# Public implementation -> (the length its target is judged at, at least this ratio).
PEER_TARGETS = {
    REFORMER_PYTORCH: (TARGET_LENGTH, 3),
    ROUTING_TRANSFORMER: (16384, 1),
    PERFORMER_PYTORCH: (16384, 1),
}
PEER_CLASSES = {
    REFORMER_PYTORCH: "LSHAttention",
    ROUTING_TRANSFORMER: "KmeansAttention",
    PERFORMER_PYTORCH: "FastAttention",
}


def kernel_targets(timings: dict[int, Timings], lengths: list[int]) -> list[Target]:
    """Rows for the speed-ups over SDPA, FLOP-rate fractions, scaling exponents and the
    ratios to the public implementations, for the variants that were measured."""
    speedups = {n: timings[n].speedups for n in lengths}
    fractions = {n: timings[n].fractions for n in lengths}
    matmuls = {n: timings[n].matmuls for n in lengths}
    longest = lengths[-1]
    measured = speedups[longest]
    rows = []
    if "full" in measured:
        rows += [
            at_most(f"full time / SDPA time, L={n}", 1 / speedups[n]["full"], 1.1) for n in lengths
        ]
    # "Faster than SDPA" is a speed-up above 1; at_least(1) would also pass a tie.
    for name, start in FASTER_FROM.items():
        for n in lengths if name in measured else []:
            value = speedups[n][name]
            row = f"{name} speed-up, L={n}"
            rows.append(Target(row, value, "> 1", value > 1) if n >= start else info(row, value))
    full_run = longest == TARGET_LENGTH  # the 32K targets only apply at 32K
    for name in [n for n in KERNELS if n in measured and n != "full"]:
        row, value = f"{name} speed-up, L={longest}", measured[name]
        if full_run and name in SPEEDUP_AT_TARGET:
            rows.append(at_least(row, value, SPEEDUP_AT_TARGET[name]))
        elif name not in FASTER_FROM:  # those have a row at every length above
            rows.append(info(row, value))
    for name, other in SAME_BLOCKS.items():  # the union costs what its blocks cost
        rows += [
            at_most(f"{name} time / {other} time, L={n}", timings[n].over_same_blocks[name], 1.5)
            for n in lengths
            if name in timings[n].over_same_blocks
        ]

    for name in [n for n in KERNELS if n in fractions[longest]]:
        row = f"{name} FLOP/s / matmul rate, L={longest}"
        wanted = full_run and name in ("blockwise", "lsh")
        value = fractions[longest][name]
        rows.append(at_least(row, value, 0.25) if wanted else info(row, value))

    for peer, (ours, _) in PEERS.items():
        judged_at, bound = PEER_TARGETS[peer]
        for n in [n for n in lengths if peer in timings[n].over_peers]:
            row = f"{ours} speed-up over {peer} {PEER_CLASSES[peer]}, L={n}"
            value = timings[n].over_peers[peer]
            if n != judged_at:
                rows.append(info(row, value))
            elif bound == 1:  # "faster than": above 1
                rows.append(Target(row, value, "> 1", value > 1))
            else:
                rows.append(at_least(row, value, bound))

    if len(lengths) > 1:
        for name in [*KERNELS, "sdpa"]:
            lengths_measured = [n for n in lengths if name in matmuls[n]]
            if len(lengths_measured) < 2:
                continue
            times = [matmuls[n][name] for n in lengths_measured]
            # Least squares over every measured length: one noisy end point moves the exponent
            # less than a two-point ratio would.
            exponent = fit_power_law(lengths_measured, times).exponent
            row = f"{name} scaling exponent {lengths_measured[0]}->{lengths_measured[-1]}"
            if name in EXPONENT_BOUNDS:
                rows.append(at_most(row, exponent, EXPONENT_BOUNDS[name]))
            elif name == "full":
                rows.append(Target(row, exponent, "~ 2 (1.8-2.2)", abs(exponent - 2) <= 0.2))
            else:
                rows.append(info(row, exponent))
    return rows


def flex_targets(lengths: list[int], rounds: int, min_seconds: float = 0.0) -> list[Target]:
    """Forward (no grad) of each FLEX_KERNELS pattern: compiled FlexAttention's time with the
    block mask of the same pattern over ours, in the same rounds; above 1 means ours is
    faster."""
    rows = []
    for length in lengths:
        calls = {
            f"{name} {impl}": forward(kernel(name, length, impl=impl), length)
            for name in FLEX_KERNELS
            for impl in ("native", "flex")
        }
        times, _ = time_in_rounds(calls, rounds, matmul_call(YARDSTICK), min_seconds)
        for name in FLEX_KERNELS:
            pairs = zip(times[f"{name} flex"], times[f"{name} native"], strict=True)
            ratio = statistics.median(flex / ours for flex, ours in pairs)
            rows.append(at_least(f"compiled flex fwd / {name} fwd, L={length}", ratio, 1.0))
        print(
            f"L={length} forward seconds: "
            + ", ".join(f"{k} {statistics.median(t):.3g}" for k, t in times.items()),
            flush=True,
        )
    return rows


# --- models: memory at 64K and depth ratios ----------------------------------------------------


def model(attention: str, length: int, depth: int = 1, block: str = "residual") -> TransformerLM:
    """The targets' model (`model_config`)."""
    return TransformerLM(model_config(attention, length, depth, block))


def training_step(net: TransformerLM, length: int) -> Callable[[], None]:
    """Forward and backward of the next-token loss on random tokens (no optimiser step)."""
    tokens = torch.randint(0, 256, (BATCH, length + 1))

    def step():
        net.zero_grad(set_to_none=True)
        logits = net(tokens[:, :-1])  # (B, L, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()

    return step


def memory_targets(length: int, variants: list[str] | None = None) -> list[Target]:
    """Peak live-tensor bytes of one training step of a one-layer model at `length`, for the
    memory kernels among `variants` (default all)."""
    rows = []
    for name in MEMORY_KERNELS + MEMORY_INFO_KERNELS:
        if variants is not None and name not in variants:
            continue
        step = training_step(model(name, length), length)
        start = time.perf_counter()
        peak = peak_memory_bytes(step)
        elapsed = time.perf_counter() - start
        row = f"{name} 1-layer fwd+bwd peak GiB, L={length} ({elapsed:.0f} s)"
        if name in MEMORY_KERNELS:
            bound = f"< {MEMORY_LIMIT_BYTES / GiB:.2f} (4 GB)"
            rows.append(Target(row, peak / GiB, bound, peak < MEMORY_LIMIT_BYTES))
        else:
            rows.append(info(row, peak / GiB))
        print(f"{row}: {peak / GiB:.2f}")
    return rows


def depth_targets(length: int, attention: str, rounds: int) -> list[Target]:
    """Reversible depth-12 / depth-1 peak memory, and reversible / residual step time at 12."""
    peaks = {
        depth: peak_memory_bytes(
            training_step(model(attention, length, depth, "reversible"), length)
        )
        for depth in (1, 12)
    }
    steps = {
        block: training_step(model(attention, length, 12, block), length)
        for block in ("residual", "reversible")
    }
    ratios = []
    for _ in range(rounds):
        residual = seconds_per_call(steps["residual"], min_time_s=0)
        reversible = seconds_per_call(steps["reversible"], min_time_s=0)
        ratios.append(reversible / residual)
    where = f"{attention}, L={length}"
    return [
        at_most(f"reversible peak memory depth 12 / depth 1 ({where})", peaks[12] / peaks[1], 1.3),
        at_most(
            f"reversible / residual step time, depth 12 ({where})", statistics.median(ratios), 1.6
        ),
    ]


DECODE_LENGTH = 65536
DECODE_SHORT = 1024  # the flat-time targets compare against this context
DECODE_WINDOWED = 4096  # past every window cache's window: its cache must not grow beyond
DECODE_STEPS = 64


def decode_columns(name: str, length: int) -> dict:
    """`measure_decode` of the targets' kernel `name` at batch 1 and context `length`."""
    shape = (BATCH, HEADS, length, HEAD_DIM)
    attend = kernel(name, length + DECODE_STEPS + 2)
    return measure_decode(attend, shape, CPU, torch.float32, steps=DECODE_STEPS, warmup=2)


def decode_targets(length: int, rounds: int) -> list[Target]:
    """Exact decode's bandwidth fraction at `length`; the fixed-state decodes' (linear,
    Performer, DeltaNet) ms/token at `length` over DECODE_SHORT (median over `rounds`, each
    measured at both contexts in turn); the window caches' bytes at `length` over
    DECODE_WINDOWED."""
    full = [decode_columns("full", length)["decode_bandwidth_fraction"] for _ in range(rounds)]
    rows = [at_least(f"full decode bandwidth fraction, L={length}", statistics.median(full), 0.5)]
    print(f"full decode bandwidth fraction at {length}: {', '.join(f'{f:.2f}' for f in full)}")
    for name in ("linear", "performer", "deltanet"):
        ratios = []
        for _ in range(rounds):
            short = decode_columns(name, DECODE_SHORT)["decode_ms_per_token"]
            ratios.append(decode_columns(name, length)["decode_ms_per_token"] / short)
        label = f"{name} decode ms/token L={length} / L={DECODE_SHORT}"
        rows.append(at_most(label, statistics.median(ratios), 1.5))
        print(f"{label}: {', '.join(f'{r:.2f}' for r in ratios)}")
    for name in ("blockwise", "longformer"):
        ratio = (
            decode_columns(name, length)["cache_bytes"]
            / decode_columns(name, DECODE_WINDOWED)["cache_bytes"]
        )
        rows.append(at_most(f"{name} cache bytes L={length} / L={DECODE_WINDOWED}", ratio, 1.0))
    return rows


# --- one training step per process: 2^20 tokens, the Reformer's 12 layers ---------------------

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
    """`step_row` in a fresh process (this script with --step-row), so the peak RSS is its own;
    a failed process (e.g. killed for memory) gives a row with its exit status."""
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


def million_rows(length: int = MILLION_LENGTH, names: str | None = None) -> list[StepRow]:
    """One layer, one training step at `length` tokens per O(L) variant (all, or `names`,
    comma-separated), with MILLION_SWITCHES; each printed as it ends."""
    chosen = names.split(",") if names else [*MILLION_KERNELS, *MILLION_NOT_RUN]
    rows = []
    for name in chosen:
        label = f"{name}, 1 layer, L={length}"
        if name in MILLION_NOT_RUN:
            row = StepRow(label, note=MILLION_NOT_RUN[name])
        else:
            row = run_step_row(label, name, length, 1, "residual", HEADS * HEAD_DIM)
            row.bound_bytes = million_bound(length)
        print(f"{row.name}: {describe(row)}", flush=True)
        rows.append(row)
    return rows


def reformer_rows(length: int = REFORMER_LENGTH, d_model: int = HEADS * HEAD_DIM) -> list[StepRow]:
    """One training step of REFORMER_DEPTH LSH layers at `length`, reversible then residual."""
    rows = []
    for block in ("reversible", "residual"):
        label = f"lsh, {REFORMER_DEPTH} {block} layers, d_model {d_model}, L={length}"
        row = run_step_row(label, "lsh", length, REFORMER_DEPTH, block, d_model)
        print(f"{row.name}: {describe(row)}", flush=True)
        rows.append(row)
    return rows


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


def print_table(rows: list[Target]) -> None:
    width = max(len(r.name) for r in rows)
    print(f"\n| {'target'.ljust(width)} | measured | bound | met |")
    print(f"|{'-' * (width + 2)}|---------:|-------|-----|")
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "NO")
        print(f"| {r.name.ljust(width)} | {r.value:8.2f} | {r.bound} | {met} |")


if __name__ == "__main__":
    main()
