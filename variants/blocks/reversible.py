"""Reversible blocks (RevNet coupling, as in the Reformer): activation memory independent of depth.

A block maps two streams (x1, x2) to y1 = x1 + Attn(LN x2), y2 = x2 + FF(LN y1), and is
inverted exactly by x2 = y2 - FF(LN y1), x1 = y1 - Attn(LN x2). The stack runs all blocks
inside one autograd Function that keeps only the last block's outputs; backward walks the
blocks in reverse, reconstructing each block's inputs from its outputs and differentiating one
sublayer at a time. So activation memory is that of one sublayer, whatever the depth, at the
price of about one extra forward per step.

The recompute must be the same function as the forward: it runs inside `replaying()` (LSH reuses
its buckets), with the RNG state each sublayer saw in forward (dropout replays its masks) and
under the forward's autocast state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from variants.attention.common.base import replaying


class ReversibleBlock(nn.Module):
    """One reversible coupling: (x1, x2) -> (y1, y2), each (batch, seq_len, d_model).

    `forward` is the plain-autograd coupling (it stores activations like a residual block); run
    blocks through `ReversibleStack` to get the memory saving. `attn` and `ff` are its
    pre-normed sublayers (`variants.layers.pre_norm_sublayers`), built by the model.
    """

    name = "reversible"

    def __init__(self, attn: nn.Module, ff: nn.Module):
        super().__init__()
        self.attn, self.ff = attn, ff

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x1, x2: (B, L, d_model) -> y1, y2: (B, L, d_model)."""
        y1 = x1 + self.attn(x2)
        y2 = x2 + self.ff(y1)
        return y1, y2


class ReversibleStack(nn.Module):
    """Reversible blocks as one layer: (batch, seq_len, d_model) -> (batch, seq_len, d_model).

    Following the Reformer, the input is duplicated into both streams (x1 = x2 = x); the two
    output streams are merged by their mean, which adds no parameters and keeps the width
    d_model, so the model's final LayerNorm and head are those of the other block types.

    Gradients flow to the input and to every parameter through the autograd graph (parameters
    are explicit inputs of the Function), so `torch.autograd.grad` works and nothing touches
    `.grad` as a side effect. Double backward (create_graph=True) is not supported.
    """

    def __init__(self, blocks: list[ReversibleBlock]):
        super().__init__()
        if not blocks:
            raise ValueError("ReversibleStack: needs at least one block, got none")
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        params, slots = _parameter_slots(self.blocks)
        y1, y2 = _ReversibleFunction.apply(x, x, list(self.blocks), slots, *params)
        return (y1 + y2) / 2  # (B, L, d_model)


def _parameter_slots(blocks) -> tuple[list[nn.Parameter], list[tuple[list[int], list[int]]]]:
    """Trainable parameters, each once (layers may share them, e.g. Linformer's layerwise
    projections), and per block the positions of its attention and feed-forward parameters."""
    params: list[nn.Parameter] = []
    position: dict[int, int] = {}
    slots = []
    for block in blocks:
        block_slots = []
        for sublayer in (block.attn, block.ff):
            indices = []
            for p in sublayer.parameters():
                if not p.requires_grad:
                    continue
                if id(p) not in position:
                    position[id(p)] = len(params)
                    params.append(p)
                indices.append(position[id(p)])
            block_slots.append(indices)
        slots.append(tuple(block_slots))
    return params, slots


class _ReversibleFunction(torch.autograd.Function):
    """The whole stack of couplings; saves only the final (y1, y2) for backward."""

    @staticmethod
    def forward(ctx, x1, x2, blocks, slots, *params):
        # Autograd records nothing in here: activations die as soon as the next one is computed.
        ctx.replay = _ReplayState.capture(x1.device)
        rng_states = []
        for block in blocks:
            attn_rng = _rng_state(x1.device)
            x1 = x1 + block.attn(x2)  # y1 (B, L, d_model)
            ff_rng = _rng_state(x1.device)
            x2 = x2 + block.ff(x1)  # y2 (B, L, d_model)
            rng_states.append((attn_rng, ff_rng))
        ctx.blocks, ctx.slots, ctx.rng_states = blocks, slots, rng_states
        ctx.save_for_backward(*params)
        # Kept outside save_for_backward so that backward can drop them once the last block's
        # inputs are reconstructed; detach() shares the version counter, which guards in-place
        # edits as save_for_backward would.
        ctx.outputs = [(y, y._version) for y in (x1.detach(), x2.detach())]
        return x1, x2

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y1, grad_y2):
        params = ctx.saved_tensors
        if not hasattr(ctx, "outputs"):
            raise RuntimeError(
                "ReversibleStack: backward ran twice; the outputs it reconstructs from were "
                "freed after the first (retain_graph=True is not supported)"
            )
        y1, y2 = _unmodified(ctx.outputs)
        del ctx.outputs
        param_grads: list[torch.Tensor | None] = [None] * len(params)
        for block, (attn_rng, ff_rng), (attn_slots, ff_slots) in zip(
            reversed(ctx.blocks), reversed(ctx.rng_states), reversed(ctx.slots), strict=True
        ):
            # Undo y2 = x2 + FF(y1); y1 also feeds y2, so its gradient gains FF's vector-Jacobian.
            y1 = y1.detach().requires_grad_()
            with ctx.replay.recompute(ff_rng):
                ff_out = block.ff(y1)  # (B, L, d_model)
            grad_y1 = grad_y1 + _backprop(ff_out, y1, grad_y2, params, ff_slots, param_grads)
            x2 = y2 - ff_out.detach()  # (B, L, d_model)
            del ff_out

            # Undo y1 = x1 + Attn(x2); x2 also feeds y2 directly, so its gradient starts at grad_y2.
            x2.requires_grad_()
            with ctx.replay.recompute(attn_rng):
                attn_out = block.attn(x2)  # (B, L, d_model)
            grad_y2 = grad_y2 + _backprop(attn_out, x2, grad_y1, params, attn_slots, param_grads)
            x1 = y1.detach() - attn_out.detach()  # (B, L, d_model)
            del attn_out

            # Step down one block: grad_y2 now holds grad_x2, and grad_x1 = grad_y1 because x1
            # reaches the output only through y1.
            y1, y2 = x1, x2.detach()
        return (grad_y1, grad_y2, None, None, *param_grads)


def _unmodified(saved) -> list[torch.Tensor]:
    for y, version in saved:
        if y._version != version:
            raise RuntimeError(
                "ReversibleStack: an output was modified in place before backward; "
                "its inputs can no longer be reconstructed"
            )
    return [y for y, _ in saved]


def _backprop(output, x, grad_output, params, slots, param_grads) -> torch.Tensor:
    """Backpropagate grad_output through one recomputed sublayer.

    Returns the gradient w.r.t. x; adds the parameters' gradients into `param_grads` at `slots`
    (positions of the sublayer's parameters in `params`).
    """
    inputs = [x, *(params[i] for i in slots)]
    grads = torch.autograd.grad(output, inputs, grad_output, allow_unused=True)
    for i, g in zip(slots, grads[1:], strict=True):
        if g is not None:
            param_grads[i] = g if param_grads[i] is None else param_grads[i] + g
    return torch.zeros_like(x) if grads[0] is None else grads[0]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU RNG state and, for a CUDA device, that device's RNG state."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


class _ReplayState:
    """What a recompute must share with the forward besides the inputs: autocast and RNG."""

    def __init__(self, device: torch.device, autocast_enabled: bool, autocast_dtype):
        self.device = device
        self.autocast_enabled = autocast_enabled
        self.autocast_dtype = autocast_dtype

    @classmethod
    def capture(cls, device: torch.device) -> _ReplayState:
        kind = device.type
        return cls(device, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))

    @contextmanager
    def recompute(self, rng_state) -> Iterator[None]:
        """Grad on, LSH buckets and RNG of the forward replayed; the caller's RNG is untouched."""
        cpu_state, cuda_state = rng_state
        cuda_devices = [self.device] if cuda_state is not None else []
        with (
            torch.random.fork_rng(devices=cuda_devices),
            torch.enable_grad(),
            torch.autocast(
                self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_enabled
            ),
            replaying(),
        ):
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, self.device)
            yield
