"""Hugging Face `generate` on attnbench variants: ms per new token, HF's default cache against
the kernels' own (`variants.hf.KernelCache`), at several prompt lengths.

    python -m benchmarks.hf_generate --variants full,linear,blockwise,moba --lengths 256,2048,8192

A tiny randomly initialised Llama (2 layers, hidden 64, 4 query heads over 2 KV heads); per
token = (time of `new` tokens - time of 1 token) / (new - 1), medians over interleaved rounds
(the two caches alternate in each round). Prints a Markdown table; `--csv PATH` writes it too.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import torch


def llama(name: str, max_len: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
        attn_implementation=name,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def seconds(model, prompt, new: int, cache_len: int | None) -> float:
    """Wall time of greedy `generate` of `new` tokens; `cache_len`: on a KernelCache."""
    from variants import hf

    extra = {} if cache_len is None else {"cache": hf.KernelCache(max_len=cache_len)}
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, **extra)  # fmt: skip
    return time.perf_counter() - start


def ms_per_token(model, prompt, new: int, rounds: int) -> dict[str, float]:
    """Median ms per decoded token on HF's default cache and on the kernels' own."""
    cache_len = prompt.shape[1] + new
    times = {"default": [], "kernel": []}
    for _ in range(rounds):
        for label, length in (("default", None), ("kernel", cache_len)):
            total = seconds(model, prompt, new, length) - seconds(model, prompt, 1, length)
            times[label].append(1e3 * total / (new - 1))
    return {label: statistics.median(values) for label, values in times.items()}


def table(rows: list[dict]) -> str:
    """The Markdown table of `rows` (this script's, or its CSV's read back)."""
    lines = [
        "| variant | prompt | ms/token, HF's cache | ms/token, KernelCache |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['variant']} | {r['prompt']} | {r['default_ms']} | {r['kernel_ms']} |" for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_generate", description=__doc__)
    parser.add_argument("--variants", default="full,linear,blockwise,moba")
    parser.add_argument("--lengths", default="256,2048,8192", help="prompt lengths")
    parser.add_argument("--new", type=int, default=32, help="new tokens (>= 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--csv", default=None)
    parser.add_argument(
        "--table-from", metavar="CSV", help="print the table of a CSV this script wrote, no runs"
    )
    args = parser.parse_args(argv)
    if args.table_from:
        with open(args.table_from, newline="") as f:
            print(table(list(csv.DictReader(f))))
        return 0
    from variants import hf

    try:
        lengths = [int(x) for x in args.lengths.split(",")]
        if min(lengths) < 1 or args.new < 2 or args.rounds < 1:
            raise ValueError("option '--lengths' must be positive, '--new' >= 2, '--rounds' >= 1")
        names = hf.register(args.variants.split(","))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    rows = []
    for name in names:
        model = llama(name, max(lengths) + args.new)
        for length in lengths:
            prompt = torch.randint(1, 100, (1, length), generator=torch.Generator().manual_seed(0))
            got = ms_per_token(model, prompt, args.new, args.rounds)
            rows.append(
                {"variant": name.removeprefix(hf.PREFIX), "prompt": length}
                | {f"{label}_ms": round(ms, 2) for label, ms in got.items()}
            )
            print(rows[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
