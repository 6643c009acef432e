"""How much of a query's attention a kernel puts on the one key that matches it, as exact
softmax attention sharpens: the weight a lookup (recall) needs, kernel by kernel.

    python -m benchmarks.lookup_weight --rows performer,performer:n_features=2048,linear

Each seed draws `length` keys of random direction and norm r, and sets every query to its own
key (q_i = k_i), so query i's logit on its match is r^2 / sqrt(d) (the row's "gap" to a typical
other key, whose logit is that times a cosine ~ N(0, 1/d)). A kernel's attention weights are
read off its outputs with one-hot values (linear in v: every kernel here), bidirectional; the
table gives the median weight on the match over queries and seeds, with its 10th and 90th
percentiles, beside exact softmax's. Float64, seeded (kernel seeds too): the same table on
every machine. Measured notes: docs/quality.md ("Covering patterns", Performer).
"""

from __future__ import annotations

import argparse
import ast
import math

import torch

from variants.registry import attention_spec, build_attention

GAPS = (1, 2, 4, 6, 8)
DEFAULT_ROWS = "performer,performer:n_features=2048,performer:n_features=16384"


def parse_row(spec: str) -> tuple[str, dict]:
    """`name` or `name:key=value;key=value` -> (name, options); values as Python literals."""
    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--rows: {item!r} in {spec!r} must be key=value")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return name, options


def lookup(gap: float, seed: int, length: int, head_dim: int) -> torch.Tensor:
    """(1, 1, length, head_dim) keys (= queries), each of norm sqrt(gap sqrt(d)): its own logit
    is `gap`."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, 1, length, head_dim, generator=generator, dtype=torch.float64)
    return keys / keys.norm(dim=-1, keepdim=True) * math.sqrt(gap * math.sqrt(head_dim))


def weights(kernel, keys: torch.Tensor) -> torch.Tensor:
    """The kernel's (length, length) attention weights of queries = keys, from its outputs on
    one-hot values, head_dim columns at a time (values are as wide as keys)."""
    length, head_dim = keys.shape[-2:]
    eye = torch.eye(length, dtype=keys.dtype)
    columns = []
    for start in range(0, length, head_dim):
        values = torch.zeros_like(keys)
        block = eye[:, start : start + head_dim]  # (L, <= D)
        values[0, 0, :, : block.shape[1]] = block
        columns.append(kernel(keys, keys, values)[0, 0, :, : block.shape[1]])  # (L, <= D)
    return torch.cat(columns, dim=1)  # (L, L): query i's weight on key j


def match_weights(row: str | None, seeds: int, length: int, head_dim: int) -> torch.Tensor:
    """(len(GAPS), seeds * length): every query's weight on its match at each gap, one kernel
    per seed (its features drawn once, as a model's); `row` None: exact softmax."""
    out = []
    for seed in range(seeds):
        kernel = None if row is None else _kernel(row, seed, head_dim)
        per_gap = []
        for gap in GAPS:
            keys = lookup(gap, seed, length, head_dim)
            if kernel is None:
                logits = keys[0, 0] @ keys[0, 0].T / math.sqrt(head_dim)  # (L, L)
                matrix = torch.softmax(logits, dim=-1)
            else:
                with torch.no_grad():
                    matrix = weights(kernel, keys)
            per_gap.append(torch.diagonal(matrix))  # (L,)
        out.append(torch.stack(per_gap))  # (gaps, L)
    return torch.cat(out, dim=1)


def _kernel(row: str, seed: int, head_dim: int):
    """The row's kernel, bidirectional, float64; `head_dim` and `seed` set where it takes them."""
    name, options = parse_row(row)
    accepted = set(attention_spec(name).defaults)
    for key, value in (("head_dim", head_dim), ("seed", seed)):
        if key in accepted:
            options.setdefault(key, value)
    return build_attention(name, **options).double().eval()


def table(rows: list[str], *, seeds: int = 8, length: int = 64, head_dim: int = 32) -> str:
    """The Markdown table: one row per kernel (and exact softmax first), one column per gap."""
    header = "| kernel | " + " | ".join(f"gap {g}" for g in GAPS) + " |"
    lines = [header, "|---|" + "---|" * len(GAPS)]
    levels = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    for row in [None, *rows]:
        cells = []
        for w in match_weights(row, seeds, length, head_dim):
            low, mid, high = torch.quantile(w, levels)
            cells.append(f"{mid:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {row or 'exact softmax'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="kernels: name[:key=value;...],...")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=32)
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    print(table(rows, seeds=args.seeds, length=args.length, head_dim=args.head_dim))


if __name__ == "__main__":
    main()
