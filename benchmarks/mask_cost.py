"""Masks and grouped KV heads: what each costs a kernel, as a ratio to the same kernel without.

    python -m benchmarks.mask_cost                          # 16K tokens, every variant that can
    python -m benchmarks.mask_cost --seq-len 4096 --kernels full,blockwise --csv out.csv
    python -m benchmarks.mask_cost --table docs/results/mask_cost.csv   # a snapshot's table

For every variant whose spec takes the input, the kernel's forward+backward at batch 1, fp32,
causal where it can be, one thread by default, at its registry defaults: `padding` (the last
25 % of the keys padded), `documents` (8 documents of L/8 tokens packed) and `GQA` (8 query
heads on 2 key/value heads, against 8: time, and the peak memory ratio), each against the same
call without. The contenders of a row are timed in interleaved rounds
(`timing.time_in_rounds`), each ratio the median over rounds (`timing.ratio`): above 1, the
input costs time. A ratio above `BOUND` (1.3) on a kernel that can skip whole blocks (its
spec's `block_sparse_work`) is flagged. Shapes and timing: docs/internals-analysis.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.measurement.memory import peak_memory_bytes
from experiments.measurement.provenance import git_commit
from experiments.measurement.timing import Ratio, quartiles, ratio, round_timer, time_in_rounds
from variants import ModelConfig, attention_names
from variants.attention.common.base import sample_gates
from variants.registry import AttentionSpec, attention_spec

CPU = torch.device("cpu")
SEQ_LEN = 16384
HEAD_DIM = 64
MASK_HEADS = 4  # d_model 256, as the scaling preset
GQA_HEADS, GQA_KV_HEADS = 8, 2
PADDED_FRACTION = 0.25
DOCUMENTS = 8
BOUND = 1.3  # a mask must not cost more than this where the kernel can skip whole blocks
FEATURES = ("padding", "documents", "gqa")
COLUMNS = {
    "padding": f"padding {PADDED_FRACTION:.0%} / none",
    "documents": f"{DOCUMENTS} documents / none",
    "gqa": f"H_kv={GQA_KV_HEADS} / H_kv={GQA_HEADS}",
    "gqa_memory": f"H_kv={GQA_KV_HEADS} / H_kv={GQA_HEADS} peak memory",
}


@dataclass(frozen=True)
class Cost:
    """One input's cost on one kernel: the ratio with / without (median and IQR over rounds)
    and the time without it (ms, median over rounds); for grouped heads also the peak memory
    with / without (one measurement each: the allocator's peak does not vary between runs);
    or why it was not measured."""

    ratio: Ratio | None = None
    base_ms: float | None = None
    error: str | None = None
    memory_ratio: float | None = None


@dataclass(frozen=True)
class Settings:
    """What a table was measured with: its length, rounds per row, threads, commit and day."""

    seq_len: int
    rounds: int
    threads: int
    commit: str
    date: str


@dataclass(frozen=True)
class Row:
    variant: str
    costs: dict[str, Cost]  # feature -> cost; a feature the variant does not take is absent

    def flagged(self, feature: str) -> bool:
        """True if `feature` is a mask whose ratio exceeds BOUND on a block-skipping kernel."""
        cost = self.costs.get(feature)
        return (
            feature != "gqa"
            and attention_spec(self.variant).block_sparse_work
            and cost is not None
            and cost.ratio is not None
            and cost.ratio.median > BOUND
        )


def supports(spec: AttentionSpec, feature: str) -> bool:
    """Whether the variant of `spec` takes `feature` at its defaults."""
    if feature == "padding":
        return spec.supports_padding_mask
    if feature == "documents":
        return spec.supports_segments
    return spec.supports_gqa and not spec.shared_qk_required


def kernel(name: str, length: int, n_heads: int, n_kv_heads: int | None = None):
    """Variant `name` at its registry defaults, as a (n_heads x HEAD_DIM)-wide model builds a
    layer's (`ModelConfig.kernel`); causal unless the variant cannot be."""
    spec = attention_spec(name)
    config = ModelConfig(
        d_model=n_heads * HEAD_DIM,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        depth=1,
        max_seq_len=length,
        attention=name,
        causal=spec.causal_supported,
    )
    return config.kernel()


def fwd_bwd(attn, heads: int, kv_heads: int, length: int, **masks) -> Callable[[], None]:
    """One forward+backward of `attn` on fixed random q (1, heads, L, D) and k, v
    (1, kv_heads, L, D), with `masks` (attention_mask, segment_ids) passed through."""
    q = torch.randn(1, heads, length, HEAD_DIM, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, length, HEAD_DIM, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(1, heads, length, HEAD_DIM)
    gates = sample_gates(attn, q)  # None unless gated (NSA, DeltaNet)

    def call():
        for t in (q, k, v):
            t.grad = None
        attn.zero_grad(set_to_none=True)
        attn(q, k, v, gates=gates, **masks).backward(grad_out)

    return call


def padding_mask(length: int) -> torch.Tensor:
    """(1, L) bool, True = real: the last PADDED_FRACTION of the positions padded (a right-padded
    sequence, as a batch of unequal lengths gives)."""
    return (torch.arange(length) < length - int(length * PADDED_FRACTION))[None]


def segment_ids(length: int) -> torch.Tensor:
    """(1, L) document ids: DOCUMENTS documents of L / DOCUMENTS tokens each."""
    return (torch.arange(length) * DOCUMENTS // length)[None]


def timed(
    calls: dict[str, Callable[[], None]], rounds: int, min_round_s: float
) -> dict[str, list[float]]:
    """Seconds per call of each contender, once per round in turn (`time_in_rounds`)."""
    time_one = round_timer(CPU, min_run_time_s=min_round_s, warmup=1)
    times, _ = time_in_rounds(calls, rounds, time_one)
    return times


def median_ms(seconds: list[float]) -> float:
    return quartiles(seconds)[1] * 1e3


def measure_masks(
    name: str, length: int, features: list[str], rounds: int, min_round_s: float
) -> dict[str, Cost]:
    """Padding and documents (those in `features`) against no mask, in the same rounds."""
    try:
        attn = kernel(name, length, MASK_HEADS)
        calls = {"none": fwd_bwd(attn, MASK_HEADS, MASK_HEADS, length)}
        inputs = {"padding": {"attention_mask": padding_mask(length)}}
        inputs["documents"] = {"segment_ids": segment_ids(length)}
        for feature in features:
            calls[feature] = fwd_bwd(attn, MASK_HEADS, MASK_HEADS, length, **inputs[feature])
        times = timed(calls, rounds, min_round_s)
    except Exception as error:  # noqa: BLE001 - a failure is a cell of the table, not the end
        return {feature: Cost(error=_one_line(error)) for feature in features}
    base = median_ms(times["none"])
    return {f: Cost(ratio(times[f], times["none"]), base) for f in features}


def measure_gqa(name: str, length: int, rounds: int, min_round_s: float) -> Cost:
    """H=8 on H_kv=2 against H_kv=8 (each kernel built from the same seed)."""
    try:
        calls = {}
        for kv_heads in (GQA_HEADS, GQA_KV_HEADS):
            torch.manual_seed(0)  # the same random parameters (features, projections) in both
            attn = kernel(name, length, GQA_HEADS, kv_heads)
            calls[kv_heads] = fwd_bwd(attn, GQA_HEADS, kv_heads, length)
        times = timed(calls, rounds, min_round_s)  # warm: the peaks below are of steady calls
        peaks = {kv_heads: peak_memory_bytes(call, CPU) for kv_heads, call in calls.items()}
    except Exception as error:  # noqa: BLE001
        return Cost(error=_one_line(error))
    return Cost(
        ratio(times[GQA_KV_HEADS], times[GQA_HEADS]),
        median_ms(times[GQA_HEADS]),
        memory_ratio=peaks[GQA_KV_HEADS] / peaks[GQA_HEADS],
    )


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:120]


def measure(
    names: list[str],
    length: int,
    rounds: int,
    min_round_s: float,
    features: tuple[str, ...] = FEATURES,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """One row per variant of `names` that takes at least one of `features`."""
    rows = []
    for name in names:
        spec = attention_spec(name)
        taken = [f for f in features if supports(spec, f)]
        if not taken:
            continue
        costs = {}
        masks = [f for f in taken if f != "gqa"]
        if masks:
            costs.update(measure_masks(name, length, masks, rounds, min_round_s))
        if "gqa" in taken:
            costs["gqa"] = measure_gqa(name, length, rounds, min_round_s)
        row = Row(name, costs)
        log(f"{name}: " + ", ".join(f"{f} {cell(row, f)}" for f in costs))
        rows.append(row)
    return rows


def cell(row: Row, feature: str) -> str:
    """A table cell: `1.07× (IQR 0.02)`, flagged `**2.10×** (IQR ...) ⚠` past the bound;
    `—` for an input the variant does not take."""
    cost = row.costs.get(feature)
    if cost is None:
        return "—"
    if cost.ratio is None:
        return f"error: {cost.error}"
    value = f"{cost.ratio.median:.2f}×"
    if row.flagged(feature):
        value = f"**{value}** ⚠"
    return f"{value} (IQR {cost.ratio.iqr:.2f})"


def memory_cell(row: Row) -> str:
    """The grouped heads' peak memory ratio, `0.62×`; `—` where not measured."""
    cost = row.costs.get("gqa")
    return "—" if cost is None or cost.memory_ratio is None else f"{cost.memory_ratio:.2f}×"


def base_cell(row: Row, features: tuple[str, ...]) -> str:
    cost = next((row.costs[f] for f in features if f in row.costs), None)
    return "—" if cost is None or cost.base_ms is None else f"{cost.base_ms:.0f}"


def table(rows: list[Row]) -> str:
    """The markdown table: one row per variant, the ratios and the times without the inputs."""
    lines = [
        f"| variant | no mask ms (H={MASK_HEADS}) | {COLUMNS['padding']} "
        f"| {COLUMNS['documents']} | H_kv={GQA_HEADS} ms (H={GQA_HEADS}) | {COLUMNS['gqa']} "
        f"| {COLUMNS['gqa_memory']} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| `{row.variant}` | {base_cell(row, ('padding', 'documents'))} "
            f"| {cell(row, 'padding')} | {cell(row, 'documents')} "
            f"| {base_cell(row, ('gqa',))} | {cell(row, 'gqa')} | {memory_cell(row)} |"
        )
    return "\n".join(lines)


def header(settings: Settings) -> str:
    """The settings a table was measured with, one paragraph."""
    return (
        f"Measured {settings.date} at commit `{settings.commit}`: L={settings.seq_len}, batch 1, "
        f"head_dim {HEAD_DIM}, fp32, {settings.threads} thread(s), forward+backward, at least "
        f"{settings.rounds} interleaved rounds per row (`python -m benchmarks.mask_cost "
        f"--seq-len {settings.seq_len}`). Ratios are medians over rounds of with / without in "
        f"the same round; **bold ⚠**: a mask above {BOUND}× on a kernel that can skip whole "
        f"blocks."
    )


# A snapshot: one line per (variant, input) measured, the settings repeated on each line.
CSV_FIELDS = (
    "variant", "feature", "ratio", "ratio_iqr", "ratio_rounds", "base_ms", "memory_ratio",
    "error", "seq_len", "rounds", "threads", "commit", "date",
)  # fmt: skip


def write_csv(rows: list[Row], settings: Settings, path: Path) -> None:
    """`rows` as a snapshot at `path` (CSV_FIELDS; empty cells where not measured)."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            for feature, cost in row.costs.items():
                m = cost.ratio
                writer.writerow(
                    {
                        "variant": row.variant,
                        "feature": feature,
                        "ratio": _cell(m and m.median),
                        "ratio_iqr": _cell(m and m.iqr),
                        "ratio_rounds": _cell(m and m.rounds),
                        "base_ms": _cell(cost.base_ms),
                        "memory_ratio": _cell(cost.memory_ratio),
                        "error": cost.error or "",
                        **vars(settings),
                    }
                )


def _cell(value: float | None) -> str:
    return "" if value is None else str(value)  # str(float) round-trips


def _number(cell: str) -> float | None:
    return float(cell) if cell else None


def read_csv(path: Path) -> tuple[list[Row], Settings]:
    """The rows and settings of a snapshot written by `write_csv`."""
    with path.open(newline="") as file:
        lines = list(csv.DictReader(file))
    if not lines:
        raise ValueError(f"{path} holds no measured rows")
    costs: dict[str, dict[str, Cost]] = {}
    for line in lines:
        measured = None
        if line["ratio"]:
            measured = Ratio(
                float(line["ratio"]), float(line["ratio_iqr"]), int(line["ratio_rounds"])
            )
        costs.setdefault(line["variant"], {})[line["feature"]] = Cost(
            measured, _number(line["base_ms"]), line["error"] or None, _number(line["memory_ratio"])
        )
    first = lines[0]
    settings = Settings(
        int(first["seq_len"]), int(first["rounds"]), int(first["threads"]), first["commit"],
        first["date"],
    )  # fmt: skip
    return [Row(variant, found) for variant, found in costs.items()], settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row")
    parser.add_argument(
        "--min-round-s",
        type=float,
        default=0.2,
        help="seconds each contender is timed for in a round (one call at least)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", help="comma-separated registry variants (default: all)")
    parser.add_argument(
        "--features", default=",".join(FEATURES), help=f"subset of {','.join(FEATURES)}"
    )
    parser.add_argument("--csv", type=Path, help="also write the rows here (a snapshot)")
    parser.add_argument(
        "--table", type=Path, help="measure nothing: print this snapshot's settings and table"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(argv)
    if args.table is not None:
        try:
            rows, settings = read_csv(args.table)
        except (OSError, ValueError, KeyError) as error:
            raise SystemExit(
                f"--table {args.table}: not a mask_cost snapshot ({error!r})"
            ) from None
        print(header(settings) + "\n\n" + table(rows))
        return rows
    if args.csv is not None and not args.csv.parent.is_dir():  # before minutes of measuring
        raise SystemExit(f"--csv: folder {str(args.csv.parent)!r} does not exist")
    torch.set_num_threads(args.threads)
    names = args.kernels.split(",") if args.kernels else attention_names()
    unknown = sorted(set(names) - set(attention_names()))
    features = tuple(args.features.split(","))
    if unknown or not set(features) <= set(FEATURES):
        bad = unknown[0] if unknown else features
        raise SystemExit(f"unknown kernel or feature {bad!r}; kernels: {attention_names()}")
    settings = Settings(
        args.seq_len, args.rounds, torch.get_num_threads(), git_commit(),
        datetime.date.today().isoformat(),
    )  # fmt: skip
    print(
        f"L={args.seq_len}, threads {settings.threads}, {args.rounds} rounds, "
        f"{args.min_round_s:g} s per contender and round",
        flush=True,
    )
    log = lambda line: print(line, flush=True)  # noqa: E731
    rows = measure(names, args.seq_len, args.rounds, args.min_round_s, features, log)
    print("\n" + header(settings) + "\n\n" + table(rows))
    if args.csv is not None:
        write_csv(rows, settings, args.csv)
    return rows


def finite_positive(rows: list[Row]) -> bool:
    """Every measured ratio positive and finite (for tests and a quick check)."""
    return all(
        c.ratio is not None and math.isfinite(c.ratio.median) and c.ratio.median > 0
        for row in rows
        for c in row.costs.values()
    )


if __name__ == "__main__":
    main(sys.argv[1:])
