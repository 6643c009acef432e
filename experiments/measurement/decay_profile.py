"""Where the decay of gated_deltanet and mamba2 starts, against the paper's initialisation.

    python -m experiments.measurement.decay_profile [--seq-len 64] [--models 20]

Per variant and `decay` (gate, mamba): `--models` freshly initialised models of the long-range
presets' shape (d_model 64, 2 heads, 2 layers, token_shift), read on one batch of their task
(long_recall, 16 pairs of 32) before any training: alpha's 5-95 % quantiles over layers, heads
and positions, the median's half-life log(1/2) / log(alpha), and *kept at the query*: the
median over scored queries of the product of alpha from the position after the pair's value to
the query (the share of the value's write the decay leaves, and of the gradient that would
teach the gate to keep it). A last row draws the paper's initialisation (Mamba-2, fla's
GatedDeltaNet: A ~ U(1, 16), dt log-uniform in [0.001, 0.1], alpha = exp(-A dt) at x W = 0).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import variants
from experiments.training.tasks import build_task

TASK = {"name": "long_recall", "n_pairs": 16, "n_keys": 32, "n_values": 32}
MODEL = {"d_model": 64, "n_heads": 2, "depth": 2, "causal": True, "token_shift": True}
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
GATE_INDEX = {"gated_deltanet": 1, "mamba2": 0}  # (beta, alpha) or (a,)


def alphas(name: str, decay: str, batch, vocab_size: int, seed: int) -> torch.Tensor:
    """alpha (layers, B, H, L) of a freshly initialised model (seed `seed`) on `batch`."""
    torch.manual_seed(seed)
    model = variants.TransformerLM(
        vocab_size=vocab_size, attention=name, attention_options={"decay": decay}, **MODEL
    )
    captured = []

    def keep(kernel, args, kwargs):
        gate = kwargs["gates"][..., GATE_INDEX[name]]
        captured.append(kernel._log_decay(gate).exp())

    handles = [k.register_forward_pre_hook(keep, with_kwargs=True) for k in model.kernels()]
    try:
        with torch.no_grad():
            model(batch.inputs)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(captured)


def kept_at_queries(alpha: torch.Tensor, batch) -> torch.Tensor:
    """Per scored query and head and layer: the product of alpha over the positions after its
    pair's value up to the query, (n,). alpha: (layers, B, H, L)."""
    log_alpha = alpha.double().log().cumsum(-1)  # (layers, B, H, L)
    kept = []
    for b, t in batch.loss_mask.nonzero().tolist():
        key = batch.inputs[b, t]
        earlier = (batch.inputs[b, :t] == key).nonzero().flatten()
        value_at = int(earlier[0]) + 1  # the pair's slot: key, then its value
        kept.append((log_alpha[:, b, :, t] - log_alpha[:, b, :, value_at]).exp().flatten())
    return torch.cat(kept)


def paper_alphas(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    a = torch.empty(n).uniform_(1.0, 16.0, generator=generator)
    dt = torch.empty(n).uniform_(math.log(1e-3), math.log(0.1), generator=generator).exp()
    return torch.exp(-a * dt)


def row(label: str, alpha: torch.Tensor, kept: torch.Tensor | None) -> str:
    values = alpha.flatten().double()
    quantiles = torch.quantile(values[: 2**24], torch.tensor(QUANTILES, dtype=torch.double))
    median = float(quantiles[2])
    half_life = math.log(0.5) / math.log(median) if 0 < median < 1 else math.inf
    cells = [label, *(f"{float(q):.3f}" for q in quantiles), f"{half_life:.1f}"]
    cells.append("—" if kept is None else f"{float(kept.median()):.2g}")
    return "| " + " | ".join(cells) + " |"


def table(seq_len: int = 64, models: int = 20) -> str:
    """The profile as Markdown: per variant and decay the quantiles of alpha over `models`
    fresh models, its median half-life and what is kept of a pair at its query; the paper's
    initialisation last (docs/variants/common.md's table)."""
    task = build_task(TASK, seq_len=seq_len, batch_size=16, seed=0)
    batch = task.batch("train", 0)
    quantiles = " | ".join(f"alpha q{round(q * 100):02d}" for q in QUANTILES)
    lines = [
        f"| variant, decay | {quantiles} | half-life (tokens) | kept at the query |",
        "|---" * (len(QUANTILES) + 3) + "|",
    ]
    for name in GATE_INDEX:
        for decay in ("gate", "mamba"):
            drawn = [alphas(name, decay, batch, task.vocab_size, s) for s in range(models)]
            kept = torch.cat([kept_at_queries(a, batch) for a in drawn])
            lines.append(row(f"{name}, {decay}", torch.cat([a.flatten() for a in drawn]), kept))
    lines.append(row("paper's init, x W = 0", paper_alphas(10**6), None))
    note = (
        f"{models} models per row at initialisation, long_recall at {seq_len} tokens (16 "
        "pairs, batch 16); kept at the query: median over queries, heads and layers."
    )
    return "\n".join(lines) + "\n\n" + note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.measurement.decay_profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seq-len", type=int, default=64, help="the task's length (64)")
    parser.add_argument("--models", type=int, default=20, help="models (seeds) per row (20)")
    args = parser.parse_args(argv)
    print(table(args.seq_len, args.models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
