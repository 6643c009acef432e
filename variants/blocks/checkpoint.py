"""The residual block under activation checkpointing: keep its input, recompute the rest."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.utils.checkpoint import checkpoint

from variants.attention.common.base import replaying
from variants.blocks.residual import ResidualBlock


def _replay_on_recompute():
    # (forward context, recompute context): the recompute reuses LSH's buckets of the forward.
    return nullcontext(), replaying()


class CheckpointBlock(ResidualBlock):
    """A residual block that stores only its input and recomputes its activations in backward.

    Same parameters and outputs as `ResidualBlock`. Backward reruns the block's forward inside
    `replaying()` (so LSH reuses its buckets) with the RNG state of the forward restored (so
    dropout masks are replayed): activation memory per block drops to its input, at the cost of
    one extra forward. Uses `torch.utils.checkpoint` with `use_reentrant=False`, which works with
    `torch.autograd.grad` and with inputs that do not require grad.
    """

    name = "checkpoint"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        if not torch.is_grad_enabled():
            return super().forward(x)  # nothing is saved for backward, nothing to recompute
        return checkpoint(super().forward, x, use_reentrant=False, context_fn=_replay_on_recompute)
