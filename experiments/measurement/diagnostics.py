"""What a trained model's kernels are handed: how alike its keys are, where its gates sit.

A state model can settle in a shortcut that no accuracy shows the cause of: DeltaNet trained on
recall with every answer in the input collapsed its keys onto one direction (mean |cos|
between keys about 0.97) and drove beta to about 1, so its state held only the most recent
value, a key-blind memory (docs/quality.md). `kernel_input_columns` measures both on one batch
of the task's validation split, per layer, so a record says whether a run is in that trap.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# Keys compared: the first this many positions of each head (the cost is quadratic in them).
MAX_POSITIONS = 512
PAD = 0  # the padding token of the generated tasks: its positions hold no key worth comparing


def key_abs_cos(k: torch.Tensor, real: torch.Tensor | None = None) -> float:
    """Mean |cos| between the keys of different positions within each (sequence, head).

    k: (B, H, L, D); real: (B, L) bool, the positions that count (None: all); only the first
    `MAX_POSITIONS` positions are read. 1: every key on one line.
    """
    k = k[:, :, :MAX_POSITIONS].float()
    length = k.shape[2]
    real = torch.ones(k.shape[0], length, dtype=torch.bool) if real is None else real
    real = real[:, :length].to(k.device)
    unit = F.normalize(k, dim=-1)  # (B, H, L', D)
    cos = (unit @ unit.transpose(-1, -2)).abs()  # (B, H, L', L')
    pairs = (real[:, :, None] & real[:, None, :]) & ~torch.eye(length, dtype=torch.bool)
    pairs = pairs.to(k.device)[:, None].expand_as(cos)  # (B, H, L', L')
    if not pairs.any():
        return float("nan")
    return float(cos[pairs].mean())


@torch.no_grad()
def kernel_input_columns(model, task, device: torch.device, precision) -> dict[str, Any]:
    """`key_abs_cos`, `gate_mean` (gated kernels: the first gate, DeltaNet's beta) averaged over
    layers, and `kernel_diagnostics` per layer, from one forward of the trained `model` over
    batch 0 of `task`'s validation split, keys compared at the positions whose input is not
    padding. The model's train/eval mode is restored."""
    captured: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def keep(_module, args, kwargs):
        gates = kwargs.get("gates", args[3] if len(args) > 3 else None)
        captured.append((args[1].detach(), None if gates is None else gates.detach()))

    handles = [k.register_forward_pre_hook(keep, with_kwargs=True) for k in model.kernels()]
    was_training = model.training
    model.eval()
    try:
        batch = task.batch(getattr(task, "validation_split", "eval"), 0).to(device)
        with precision.autocast():
            model(batch.inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if not captured:
        return {}
    real = batch.inputs != PAD  # (B, L)
    cosines = [key_abs_cos(k, real) for k, _ in captured]
    gates = [None if g is None else float(g[..., 0].float().mean()) for _, g in captured]
    parts = []
    for layer, (cos, gate) in enumerate(zip(cosines, gates, strict=True)):
        part = f"layer {layer}: |cos| {cos:.2f}"
        parts.append(part if gate is None else f"{part}, gate {gate:.3f}")
    columns: dict[str, Any] = {
        "key_abs_cos": sum(cosines) / len(cosines),
        "kernel_diagnostics": "; ".join(parts),
    }
    if all(g is not None for g in gates):
        columns["gate_mean"] = sum(gates) / len(gates)
    return columns
