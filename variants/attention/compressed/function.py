"""Compressed attention's kernel: the block compressions (max, conv; the mean is
`common.pooling.block_mean`) and `PastBlocksAndOwnBlock`, the causal attention over the past
compressed blocks and the own block, forward and backward (an autograd function)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from variants.attention.common import flash
from variants.attention.common.base import pad_to_multiple


def block_max(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Per-channel maximum over each block of `factor` positions: (B, H, L, D) -> (B, H, C, D)."""
    pad = -x.shape[2] % factor
    padded = F.pad(x, (0, 0, 0, pad), value=float("-inf"))  # (B, H, C*f, D); padding never wins
    return padded.unflatten(2, (-1, factor)).amax(dim=3)  # (B, H, C, D)


def block_conv(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Strided convolution over each block (kernel = stride): (B, H, L, D) -> (B, H, C, D).

    With kernel = stride the windows do not overlap, so the conv is one matmul of each flattened
    block with the kernel, shared by all heads; that avoids the channels-first transposes and is
    faster than Conv1d's own kernels at these shapes. The weights are cast to x's dtype (half
    inputs meet float32 parameters when the kernel is called outside autocast).
    """
    factor = conv.stride[0]
    blocks = pad_to_multiple(x, factor).unflatten(2, (-1, factor))  # (B, H, C, f, D); zero pad
    kernel = conv.weight.permute(0, 2, 1).flatten(1)  # (D_out, f*D_in), matches blocks' order
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    return F.linear(blocks.flatten(3), kernel.to(x.dtype), bias)  # (B, H, C, D)


class PastBlocksAndOwnBlock(torch.autograd.Function):
    """Causal compressed attention: each query over the compressed blocks that ended before its
    own block began, and exactly over its own block up to itself; the two parts merged.

    Both parts are plain causal attentions in the right layout, so the fused kernels' causal
    flag does all the masking and no mask tensor exists (O(L) memory on the fused path):
      own   blocks as batch entries, (B, H*C, f, D) against the raw keys of the same block.
      past  the t-th query of every block as a sequence, (B, H*f, C-1, D), for blocks 1..C-1:
            block c' sees compressed keys c < c', i.e. key row c <= query row c' - 1, which is
            the causal mask between those C-1 queries and compressed keys 0..C-2.
    The parts are merged with their logsumexps, and the backward runs each part's attention
    backward given the merged output and logsumexp (see `flash`).
    """

    @staticmethod
    def forward(ctx, q, k, v, keys, values, factor):
        """q: (B, H, L, D) raw; k, v: (B, H_kv, L, D) raw, H_kv dividing H (grouped heads:
        query head h reads key head h // (H / H_kv)); keys, values: (B, H_kv, C, D)
        compressed, C = ceil(L / f). Returns (B, H, L, D)."""
        batch, heads, length, head_dim = q.shape
        n_blocks, scale = keys.shape[2], head_dim**-0.5
        blocked = (batch, heads, n_blocks, factor)
        layout = OwnBlocks(factor, n_blocks, grouped=k.shape[1] != heads)
        q_own, k_own, v_own = (layout.of(x) for x in (q, k, v))
        out, lse = flash.attend(q_own, k_own, v_own, scale=scale, causal=True)
        out = layout.back(out, blocked)  # (B, H, C, f, D)
        lse = layout.back(lse.unsqueeze(-1), blocked).squeeze(-1)  # (B, H, C, f)
        if n_blocks > 1:
            q_past = past_queries(layout.back(q_own, blocked))  # (B, H*f, C-1, D)
            k_past, v_past = (layout.past_keys(x) for x in (keys, values))
            out_past, lse_past = flash.attend(q_past, k_past, v_past, scale=scale, causal=True)
            out_past = from_past(out_past, factor)  # (B, H, C-1, f, D)
            lse_past = from_past(lse_past.unsqueeze(-1), factor)  # (B, H, C-1, f, 1)
            flash.merge_into(out[:, :, 1:], lse.unsqueeze(-1)[:, :, 1:], out_past, lse_past)
        ctx.factor = factor
        ctx.save_for_backward(q, k, v, keys, values, out, lse)
        return out.reshape(batch, heads, n_blocks * factor, head_dim)[:, :, :length]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, keys, values, out, lse = ctx.saved_tensors
        factor = ctx.factor
        batch, heads, length, head_dim = q.shape
        n_blocks, scale = keys.shape[2], head_dim**-0.5
        blocked = (batch, heads, n_blocks, factor)
        layout = OwnBlocks(factor, n_blocks, grouped=k.shape[1] != heads)
        grad_out = own_blocks(grad_out, factor).view(*blocked, head_dim)  # padded rows get 0
        q_own, k_own, v_own = (layout.of(x) for x in (q, k, v))
        grad_q, grad_k, grad_v = flash.attend_backward(
            layout.of_blocked(grad_out),
            q_own,
            k_own,
            v_own,
            layout.of_blocked(out),
            layout.of_blocked(lse.unsqueeze(-1)).squeeze(-1),
            scale=scale,
            causal=True,
        )  # q's and k's heads in the own blocks' layout
        grad_q = layout.back(grad_q, blocked)  # (B, H, C, f, D)
        kv_blocked = (batch, k.shape[1], n_blocks, factor)
        grad_k, grad_v = (layout.back(g, kv_blocked) for g in (grad_k, grad_v))  # (B,H_kv,C,f,D)
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)  # (B,H_kv,C,D)
        if n_blocks > 1:
            q_past = past_queries(layout.back(q_own, blocked))  # (B, H*f, C-1, D)
            k_past, v_past = (layout.past_keys(x) for x in (keys, values))
            grad_q_past, grad_k_past, grad_v_past = flash.attend_backward(
                past_queries(grad_out),
                q_past,
                k_past,
                v_past,
                past_queries(out),
                past_queries(lse.unsqueeze(-1)).squeeze(-1),
                scale=scale,
                causal=True,
            )  # (B, H*f, C-1, D); k's and v's (B, H*f or H_kv, C-1, D)
            grad_q[:, :, 1:] += from_past(grad_q_past, factor)
            grad_keys[:, :, :-1] = layout.past_key_grad(grad_k_past)
            grad_values[:, :, :-1] = layout.past_key_grad(grad_v_past)
        grads = (
            x.reshape(batch, x.shape[1], n_blocks * factor, head_dim)[:, :, :length]
            for x in (grad_q, grad_k, grad_v)
        )
        return *grads, grad_keys, grad_values, None


class OwnBlocks:
    """Where the own-block part and the past part put heads, plain or grouped.

    Plain (H_kv = H): blocks are the fused kernel's heads, (B, H*C, f, D), a view of the
    positions, and the past part's keys are repeated once per query sequence (`past_keys`).
    Grouped (H_kv < H): the fused kernel maps query set n to key set n // G along its head
    axis, so the heads must be that axis: blocks become the batch, (B*C, H, f, D) against
    (B*C, H_kv, f, D), one copy of each (the keys' at H_kv heads, never repeated); and the past
    part's (B, H*f, C-1, D) query sequences h*f + t read compressed key head h // G as groups of
    G*f, so its keys are the compressed ones themselves, (B, H_kv, C-1, D).
    """

    def __init__(self, factor: int, n_blocks: int, *, grouped: bool):
        self.factor, self.n_blocks, self.grouped = factor, n_blocks, grouped

    def of(self, x: torch.Tensor) -> torch.Tensor:
        """Positions (B, N, L, E) -> the own blocks' layout."""
        if not self.grouped:
            return own_blocks(x, self.factor)  # (B, N*C, f, E)
        blocked = pad_to_multiple(x, self.factor).unflatten(2, (self.n_blocks, self.factor))
        return self.of_blocked(blocked)  # (B*C, N, f, E)

    def of_blocked(self, x: torch.Tensor) -> torch.Tensor:
        """Blocks (B, N, C, f, E) -> the own blocks' layout."""
        if not self.grouped:
            return x.flatten(1, 2)  # (B, N*C, f, E)
        return x.transpose(1, 2).flatten(0, 1).contiguous()  # (B*C, N, f, E)

    def back(self, x: torch.Tensor, blocked: tuple[int, int, int, int]) -> torch.Tensor:
        """The own blocks' layout -> blocks (B, N, C, f, E), `blocked` = (B, N, C, f)."""
        if not self.grouped:
            return x.reshape(*blocked, x.shape[-1])
        batch, sets, n_blocks, factor = blocked
        return x.view(batch, n_blocks, sets, factor, -1).transpose(1, 2).contiguous()

    def past_keys(self, x: torch.Tensor) -> torch.Tensor:
        """Compressed keys (B, H_kv, C, D) as the past part reads them."""
        if not self.grouped:
            return past_keys(x, self.factor)  # (B, H*f, C-1, D)
        return x[:, :, :-1]  # (B, H_kv, C-1, D): groups of G*f query sequences

    def past_key_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """The past part's key gradient -> compressed keys 0..C-2, (B, H_kv, C-1, D)."""
        if not self.grouped:
            # Every one of the f query sequences saw the same compressed keys.
            return grad.unflatten(1, (-1, self.factor)).sum(dim=2)
        return grad


def own_blocks(x: torch.Tensor, factor: int) -> torch.Tensor:
    """(B, H, L, E) -> (B, H*C, f, E), zero-padded to C*f positions; a copy only if needed."""
    batch, heads, _, width = x.shape
    return pad_to_multiple(x, factor).reshape(batch, -1, factor, width)


def past_queries(x: torch.Tensor) -> torch.Tensor:
    """(B, H, C, f, E) blocks -> (B, H*f, C-1, E): the t-th row of blocks 1..C-1, per t."""
    return x[:, :, 1:].transpose(2, 3).flatten(1, 2).contiguous()


def from_past(x: torch.Tensor, factor: int) -> torch.Tensor:
    """The inverse of `past_queries` as a view: (B, H*f, C-1, E) -> (B, H, C-1, f, E)."""
    return x.unflatten(1, (-1, factor)).transpose(2, 3)


def past_keys(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Compressed keys 0..C-2 once per query sequence of `past_queries`: (B, H, C, D) ->
    (B, H*f, C-1, D). The last compressed block ends after every query of the sequence."""
    batch, heads, n_blocks, width = x.shape
    shape = (batch, heads, factor, n_blocks - 1, width)
    return x[:, :, :-1].unsqueeze(2).expand(shape).reshape(batch, heads * factor, -1, width)
