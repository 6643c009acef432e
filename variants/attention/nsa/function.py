"""NSA's autograd functions: the compressed branch (queries over the compressed keys of the
blocks that ended before them) and the window branch (query tiles against an overlapping
window of keys), each with its flash backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from variants.attention import flash

# Query rows per fused call of the compressed branch (its bias is rows x blocks).
ROWS = 2048


# Query rows per tile of the window branch: each tile attends to window + WINDOW_ROWS keys,
# so longer tiles mean fewer, larger fused calls but more hidden pairs scored.
WINDOW_ROWS = 128


# Bytes of key and value gradients per fused backward call of the window branch (temporaries
# of a few MiB are reused between calls; fresh large ones cost their page faults each time).
WINDOW_CHUNK_BYTES = 8 * 2**20


class CompressedBranch(torch.autograd.Function):
    """Each query at i over the compressed keys and values of the blocks that ended at or
    before i: blocks c < m_i = floor((i + 1) / b); 0 where m_i = 0.

    q: (B, H, L, D); keys, values: (B, H, n, D). Returns (B, H, L, D). Rows run in ranges of
    ROWS, each against the first m of its last row (fused attention with a bias hiding the
    blocks a row may not see yet); the backward is the same calls' attention backward.
    """

    @staticmethod
    def forward(ctx, q, keys, values, block):
        out = torch.zeros_like(q, memory_format=torch.contiguous_format)
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        lse = torch.zeros(q.shape[:3], dtype=lse_dtype, device=q.device)
        for rows, count, bias in _row_ranges(q, block):
            part_out, part_lse = flash.attend(
                q[:, :, rows], keys[:, :, :count], values[:, :, :count], scale=_scale(q), bias=bias
            )
            out[:, :, rows], lse[:, :, rows] = part_out, part_lse
        ctx.block = block
        ctx.save_for_backward(q, keys, values, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, keys, values, out, lse = ctx.saved_tensors
        grad_q = torch.zeros_like(q, memory_format=torch.contiguous_format)
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)
        for rows, count, bias in _row_ranges(q, ctx.block):
            dq, dk, dv = flash.attend_backward(
                grad_out[:, :, rows].contiguous(),
                q[:, :, rows],
                keys[:, :, :count],
                values[:, :, :count],
                out[:, :, rows].contiguous(),
                lse[:, :, rows].contiguous(),
                scale=_scale(q),
                bias=bias,
            )
            grad_q[:, :, rows] = dq
            grad_keys[:, :, :count] += dk
            grad_values[:, :, :count] += dv
        return grad_q, grad_keys, grad_values, None


def _scale(q: torch.Tensor) -> float:
    return q.shape[-1] ** -0.5


def _row_ranges(q: torch.Tensor, block: int):
    """(rows, m, bias): ranges of at most ROWS query rows that see at least one block, the
    blocks the range's last row sees, and the bias hiding block c from row i where
    c >= floor((i + 1) / b) (None when every row sees all m)."""
    length = q.shape[2]
    for first in range(block - 1, length, ROWS):  # rows before b - 1 see nothing: output 0
        rows = slice(first, min(first + ROWS, length))
        count = rows.stop // block  # floor((last + 1) / b)
        position = torch.arange(rows.start, rows.stop, device=q.device)
        blocks = torch.arange(count, device=q.device)
        hidden = blocks[None, :] >= ((position + 1) // block)[:, None]  # (r, m)
        bias = flash.hidden_bias(hidden, q.dtype)[None, None] if bool(hidden.any()) else None
        yield rows, count, bias


class WindowBranch(torch.autograd.Function):
    """Each query at i over the keys i - window < j <= i, no gather: queries in tiles of
    WINDOW_ROWS rows, each tile against the window + rows keys that end at its last row, an
    overlapping view of the keys front-padded by `window` zeros. One band bias serves every
    tile (the first tiles' also hides the padding); the backward adds each tile's key and
    value gradients back where the tiles overlap.

    q, k, v: (B, H, L, D); returns (B, H, L, D). Saves the padded q, k, v, output and
    logsumexp: O(L d).
    """

    @staticmethod
    def forward(ctx, q, k, v, window):
        tiles = _WindowTiles(q, window)
        qp, kp, vp = tiles.pad_queries(q), tiles.pad_keys(k), tiles.pad_keys(v)
        out = torch.empty_like(qp)  # (S', n, rows, D)
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        lse = torch.empty(out.shape[:3], dtype=lse_dtype, device=q.device)  # (S', n, rows)
        for first, end in tiles.chunks():
            out[:, first:end], lse[:, first:end] = flash.attend(
                qp[:, first:end],
                tiles.keys(kp, first, end),
                tiles.keys(vp, first, end),
                scale=_scale(q),
                bias=tiles.bias(first, end, q.dtype),
            )  # (S', m, rows, D), (S', m, rows)
        ctx.tiles = tiles
        ctx.save_for_backward(qp, kp, vp, out, lse)
        return tiles.unpad_queries(out)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        qp, kp, vp, out, lse = ctx.saved_tensors
        tiles = ctx.tiles
        grad = tiles.pad_queries(grad_out)  # (S', n, rows, D)
        grad_q = torch.empty_like(qp)
        grad_k, grad_v = torch.zeros_like(kp), torch.zeros_like(vp)  # (S', window + n rows, D)
        for first, end in tiles.chunks():
            grad_q[:, first:end], dk, dv = flash.attend_backward(
                grad[:, first:end],
                qp[:, first:end],
                tiles.keys(kp, first, end),
                tiles.keys(vp, first, end),
                out[:, first:end],
                lse[:, first:end],
                scale=_scale(qp),
                bias=tiles.bias(first, end, qp.dtype),
            )  # (S', m, rows, D), (S', m, window + rows, D) twice
            tiles.add_keys(grad_k, dk, first, end)
            tiles.add_keys(grad_v, dv, first, end)
        return (
            tiles.unpad_queries(grad_q),
            tiles.unpad_keys(grad_k),
            tiles.unpad_keys(grad_v),
            None,
        )


class _WindowTiles:
    """The layout of `WindowBranch` at one shape: n tiles of `rows` queries; tile t holds the
    queries [t rows, (t + 1) rows) and the keys [t rows - w, (t + 1) rows) with w = min(window,
    L) (more is never visible), i.e. rows [t rows, t rows + w + rows) of the padded keys."""

    def __init__(self, q: torch.Tensor, window: int):
        self.batch, self.heads, self.length, self.head_dim = q.shape
        self.window = min(window, self.length)
        self.rows = min(WINDOW_ROWS, self.length)
        self.n_tiles = -(-self.length // self.rows)
        self.width = self.window + self.rows  # keys per tile
        per_tile = 2 * self.batch * self.heads * self.width * self.head_dim * q.element_size()
        self.chunk = max(1, WINDOW_CHUNK_BYTES // per_tile)
        # Query row r of a tile sees key column c where r < c <= r + w (i - w < j <= i).
        row = torch.arange(self.rows, device=q.device)[:, None]
        column = torch.arange(self.width, device=q.device)[None, :]
        self.hidden = (column <= row) | (column > row + self.window)  # (rows, w + rows)
        self.column = column

    def chunks(self):
        for first in range(0, self.n_tiles, self.chunk):
            yield first, min(first + self.chunk, self.n_tiles)

    def pad_queries(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, D) -> (S', n, rows, D), zero rows after the last query."""
        padded = F.pad(x, (0, 0, 0, self.n_tiles * self.rows - self.length))
        return padded.reshape(-1, self.n_tiles, self.rows, self.head_dim)

    def unpad_queries(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.batch, self.heads, self.n_tiles * self.rows, self.head_dim)
        return x.reshape(shape)[:, :, : self.length]

    def pad_keys(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, D) -> (S', w + n rows, D): w zero rows before the first key (and zeros
        after the last, up to the last tile's end)."""
        padded = F.pad(x, (0, 0, self.window, self.n_tiles * self.rows - self.length))
        return padded.reshape(-1, self.window + self.n_tiles * self.rows, self.head_dim)

    def unpad_keys(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.batch, self.heads, -1, self.head_dim)
        return x.view(shape)[:, :, self.window : self.window + self.length]

    def keys(self, padded: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """Tiles [first, end) of `pad_keys`: an overlapping view (S', m, w + rows, D)."""
        step, d = padded.stride(0), self.head_dim
        shape, strides = (padded.shape[0], end - first, self.width, d), (step, self.rows * d, d, 1)
        return padded.as_strided(shape, strides, padded.storage_offset() + first * self.rows * d)

    def add_keys(self, total: torch.Tensor, tiles: torch.Tensor, first: int, end: int) -> None:
        """Add the tiles' key gradients (S', m, w + rows, D) into `total`, the `pad_keys`
        layout, in slices of `rows` columns (no slice overlaps another of the same tile)."""
        step, d = total.stride(0), self.head_dim
        for start in range(0, self.width, self.rows):
            size = min(self.rows, self.width - start)
            shape, strides = (total.shape[0], end - first, size, d), (step, self.rows * d, d, 1)
            offset = total.storage_offset() + (first * self.rows + start) * d
            total.as_strided(shape, strides, offset).add_(tiles[:, :, start : start + size])

    def bias(self, first: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """The band bias of tiles [first, end): (1, 1, rows, w + rows), or (1, m, rows, w +
        rows) where a tile's keys start before position 0 (padding hidden too)."""
        if first * self.rows >= self.window:
            return flash.hidden_bias(self.hidden, dtype)[None, None]
        tile = torch.arange(first, end, device=self.hidden.device)[:, None, None]
        before = tile * self.rows - self.window + self.column < 0  # (m, 1, w + rows)
        return flash.hidden_bias(self.hidden | before, dtype)[None]
