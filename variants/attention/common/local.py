"""Sliding windows of whole blocks: the machinery shared by blockwise and strided attention.

The sequence is cut into blocks of `block_size`; query block i attends to the keys of blocks
i - look_backward .. i + look_forward (its window). Windows are views built by padding and
unfolding, so the work is O(L * window) and no (L, L) tensor ever exists. Neighbour blocks that
fall outside the sequence are zero blocks whose keys `window_mask` removes: windows never wrap
around.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from variants import patterns
from variants.attention.common.base import pad_to_multiple, without_self
from variants.attention.common.masking import document_mask


def to_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, H, L, D) -> (B, H, n, block_size, D), zero-padding L up to n * block_size."""
    x = pad_to_multiple(x, block_size)  # (B, H, n*b, D)
    return x.unflatten(2, (-1, block_size))  # (B, H, n, b, D)


def from_blocks(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, H, n, b, ...) -> (B, H, seq_len, ...): undo `to_blocks`, dropping padded rows."""
    return x.flatten(2, 3)[:, :, :seq_len]


def key_windows(
    x: torch.Tensor, block_size: int, look_backward: int, look_forward: int
) -> torch.Tensor:
    """Each query block's window of keys (or values), in position order.

    x: (B, H, L, D) -> (B, H, n, w * block_size, D), w = 1 + look_backward + look_forward,
    n = ceil(L / block_size). Window i holds positions (i - look_backward) * block_size onwards;
    positions outside [0, L) are zeros. Consecutive windows overlap, so the result is a strided
    view of one padded copy of x rather than w copies.
    """
    return _KeyWindows.apply(x, block_size, look_backward, look_forward)


class _KeyWindows(torch.autograd.Function):
    # `unfold` gives the overlapping view for free, but its generic backward measured about
    # twice as slow on CPU as summing the w window slots back with shifted block adds; at long
    # lengths that difference is a tenth of blockwise attention's whole forward+backward.

    @staticmethod
    def forward(ctx, x, block_size, look_backward, look_forward):
        ctx.layout = (x.shape[2], block_size, look_backward, look_forward)
        return windows_of(x, block_size, look_backward, look_forward)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_windows):
        return sum_windows(grad_windows, *ctx.layout), None, None, None


def windows_of(
    x: torch.Tensor, block_size: int, look_backward: int, look_forward: int
) -> torch.Tensor:
    """`key_windows` without autograd: (B, H, L, D) -> (B, H, n, w * block_size, D) view."""
    seq_len = x.shape[2]
    n_blocks = -(-seq_len // block_size)
    width = 1 + look_backward + look_forward
    before = look_backward * block_size
    after = n_blocks * block_size - seq_len + look_forward * block_size
    padded = F.pad(x, (0, 0, before, after))  # (B, H, (n+w-1)*b, D)
    windows = padded.unfold(2, width * block_size, block_size)  # (B, H, n, D, w*b)
    return windows.transpose(-1, -2)  # (B, H, n, w*b, D)


def sum_windows(
    grad_windows: torch.Tensor, seq_len: int, block_size: int, look_backward: int, look_forward: int
) -> torch.Tensor:
    """The gradient of `key_windows`: (B, H, n, w * block_size, D) -> (B, H, L, D), every
    position's window slots added back."""
    width = 1 + look_backward + look_forward
    slots = grad_windows.unflatten(3, (width, block_size))  # (B, H, n, w, b, D)
    batch, heads, n_blocks, _, _, head_dim = slots.shape
    grad = slots.new_zeros(batch, heads, n_blocks + width - 1, block_size, head_dim)
    for slot in range(width):  # window slot `slot` of block i is padded block i + slot
        grad[:, :, slot : slot + n_blocks] += slots[:, :, :, slot]
    before = look_backward * block_size
    return grad.flatten(2, 3)[:, :, before : before + seq_len]  # (B, H, L, D)


def window_mask(
    pattern: patterns.Pattern,
    seq_len: int,
    block_size: int,
    look_backward: int,
    look_forward: int,
    *,
    exclude_self: bool = False,
    device: torch.device | None = None,
    attention_mask: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which window keys each query may attend: bool (n, block_size, w * block_size), or
    (B, n, block_size, w * block_size) with a key padding mask or segment ids ((B, L) each:
    `masking.document_mask`, applied before the shared-QK rule).

    True where `pattern` allows the pair (query i, window key j) and j is a real position
    (0 <= j < seq_len: missing edge blocks and padding are masked); with `exclude_self`, j != i
    unless i has no other key (`base.without_self`, the shared-QK rule). Keys outside the
    window are not represented: the pattern must allow none (blockwise's local pattern, strided
    attention's band of stride - 1). Built once per call and broadcast over batch and heads; its
    size is O(L * window), not O(L^2).
    """
    n_blocks = -(-seq_len // block_size)
    width = 1 + look_backward + look_forward
    key_offset = torch.arange(width * block_size, device=device) - look_backward * block_size
    query_offset = torch.arange(block_size, device=device)[:, None]  # (b, 1)
    block_start = torch.arange(n_blocks, device=device)[:, None] * block_size  # (n, 1)
    key_pos = (block_start + key_offset)[:, None, :]  # (n, 1, w*b)
    if pattern.shift_invariant(block_size):
        # Every block's (b, w*b) pattern is the same: evaluate it once, in a block far enough
        # in that its window starts at a position >= 0.
        start = look_backward * block_size
        allowed = pattern.allows(start + query_offset, start + key_offset)  # (b, w*b)
    else:
        query_pos = (block_start + query_offset[:, 0])[:, :, None]  # (n, b, 1)
        allowed = pattern.allows(query_pos, key_pos)  # (n, b, w*b)
    # Which keys exist depends only on the block: edge windows and padding miss some.
    real_key = (key_pos >= 0) & (key_pos < seq_len)  # (n, 1, w*b)
    allowed = allowed & real_key  # (n, b, w*b)
    if attention_mask is not None or segment_ids is not None:
        query_pos = (block_start + query_offset[:, 0])[:, :, None]  # (n, b, 1)
        documents = document_mask(attention_mask, segment_ids, query_pos, key_pos)
        allowed = allowed & documents  # (B, n, b, w*b)
    if exclude_self:
        is_self = key_offset - query_offset == 0  # (b, w*b)
        allowed = without_self(allowed, is_self)  # (n, b, w*b)
    return allowed


def grouped_window_attention(
    q_blocks: torch.Tensor, k_windows: torch.Tensor, v_windows: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Query blocks over their key windows with grouped KV heads, never repeating the keys.

    q_blocks (B, H, n, b, D), k_windows and v_windows (B, H_kv, n, w*b, D) with H_kv dividing H,
    mask (n, b, w*b) or (B, n, b, w*b) -> (B, H, n, b, D).

    SDPA's `enable_gqa` maps query head h to key head h // (H / H_kv) along dim -3, and on CPU
    its fused (flash) kernel takes that mapping without repeating the keys only for 4-D inputs
    (5-D ones fall back to the math path, which repeats them). So blocks become SDPA's batch
    and heads its heads, one call per sequence: a sequence's windows are a strided view that
    cannot be merged with the batch axis without copying them. Measured on CPU (L = 16K, H = 8,
    H_kv = 2), folding the G query heads into the query rows instead held more memory (a copy
    of q, of the output and a G times taller mask).
    """
    per_sequence = mask.unbind(0) if mask.dim() == 4 else [mask] * q_blocks.shape[0]
    outs = [
        F.scaled_dot_product_attention(
            q.transpose(0, 1),  # (n, H, b, D)
            k.transpose(0, 1),  # (n, H_kv, w*b, D)
            v.transpose(0, 1),
            attn_mask=m[:, None],  # (n, 1, b, w*b): the same over heads
            enable_gqa=True,
        ).transpose(0, 1)  # (H, n, b, D)
        for q, k, v, m in zip(
            q_blocks.unbind(0), k_windows.unbind(0), v_windows.unbind(0), per_sequence, strict=True
        )
    ]
    return torch.stack(outs)  # (B, H, n, b, D)
