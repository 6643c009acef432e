"""NSA, Native Sparse Attention (Yuan et al. 2025): compressed, selected and window branches.

Keys and values are cut into blocks of `block_size` (compression and selection blocks equal,
stride = size; the paper uses blocks of 32 with stride 16 for compression and 64 for
selection). Three branches per query at position i, all softmax attention with scale 1/sqrt(d):

  compressed  over the compressed key and value of every block that ends at or before i
              ((c + 1) b - 1 <= i); before the first block ends there is none and the branch
              gives 0. `compress`: `mean` (the block's average) or `mlp` (the paper's learned
              map with intra-block positions: a learned position vector added to each of the
              block's b keys, the b x d block flattened, Linear(b d, d), GELU, Linear(d, d);
              one MLP for keys and one for values, shared by the heads).
  selected    the `n_select` blocks with the largest compressed-branch probability for this
              query among the blocks it may see, always including its own block: its own block
              (causal inside it) plus the `n_select - 1` other blocks with the largest
              probability (all of them if fewer). The other candidates are the blocks before
              its own (the compressed branch scores exactly those, and the own block when it
              has just ended); a softmax over one query's scores ranks as the scores do, so
              the ranking uses q . compressed key. Per query and per head (no GQA groups
              here); no gradient flows through the selection.
  window      over the last `window` tokens up to i, i included (i - window < j <= i).

Output g_cmp o_cmp + g_sel o_sel + g_win o_win with the gates `gates[..., 0]`, `[..., 1]`,
`[..., 2]` in (0, 1) per head and position (the layer computes them from the token).

Causal only: every branch is defined on the past. The selected branch is MoBA's kernel
(`moba.function.SelectedBlocks`), the window one `WindowBranch` (query tiles against an overlapping
view of the keys, one band bias) and the compressed one a fused attention over row ranges,
each range against the compressed keys its last row may see, with a bias for the rest.

Decoding (`cache.BlockKVCache`): every raw key and value (a later query may select any block,
and the window is the cache's last `window` positions) and the compressed key and value of
every ended block, compressed when its last position arrives (that position's query already
sees it). A new query at i: the compressed branch over the held summaries, the selected one
over its own block and the n_select - 1 earlier blocks whose compressed key scores highest
(`moba.selection.attend_selected`), the window over the last `window` positions, gated by the
gates the layer computed from its token. O((L / b + n b + w) d) per token, plus one block's
compression every b tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from variants.attention import flash
from variants.attention.base import Attention, pad_to_multiple
from variants.attention.cache import BlockKVCache, attend_prefix
from variants.attention.compressed import block_mean
from variants.attention.moba.function import SelectedBlocks
from variants.attention.moba.selection import attend_selected, block_select_pairs, top_blocks
from variants.checks import require_choice, require_positive_int
from variants.registry import register_attention

COMPRESS = ("mean", "mlp")
# Query rows per fused call of the compressed branch (its bias is rows x blocks).
ROWS = 2048
# Query rows per tile of the window branch: each tile attends to window + WINDOW_ROWS keys,
# so longer tiles mean fewer, larger fused calls but more hidden pairs scored.
WINDOW_ROWS = 128
# Bytes of key and value gradients per fused backward call of the window branch (temporaries
# of a few MiB are reused between calls; fresh large ones cost their page faults each time).
WINDOW_CHUNK_BYTES = 8 * 2**20


@register_attention
class NSAAttention(Attention):
    """NSA: gated compressed, selected (top-n blocks) and sliding-window branches."""

    name = "nsa"
    exact = False
    time_complexity = "O(L (n b + w + L / b) d)"
    memory_complexity = "O(L n d)"
    softmax_kernels = "flash"
    bidirectional_supported = False
    bidirectional_reason = (
        "NSA's branches are defined on the past (blocks that ended, a window back to i)"
    )
    n_gates = 3
    supports_decode = True

    def __init__(
        self,
        *,
        causal: bool = True,
        block_size: int = 64,
        n_select: int = 16,
        window: int = 512,
        compress: str = "mlp",
        head_dim: int = 64,
    ):
        super().__init__(causal=causal)
        self.block_size = require_positive_int(self.name, "block_size", block_size)
        self.n_select = require_positive_int(self.name, "n_select", n_select)
        self.window = require_positive_int(self.name, "window", window)
        self.compress = require_choice(self.name, "compress", compress, COMPRESS)
        self.head_dim = require_positive_int(self.name, "head_dim", head_dim)
        self.key_mlp = self.value_mlp = None
        if self.compress == "mlp":
            self.key_mlp = BlockMLP(block_size, head_dim)
            self.value_mlp = BlockMLP(block_size, head_dim)

    def compressed(self, x: torch.Tensor, mlp: BlockMLP | None) -> torch.Tensor:
        """One vector per block of `block_size`: (B, H, L, D) -> (B, H, ceil(L / b), D). A short
        last block is summarised too (mean of its real positions; the MLP sees zero padding),
        though no query ever sees it: it ends after the last position."""
        if mlp is None:
            return block_mean(x, self.block_size)
        return mlp(x)

    def _check_head_dim(self, head_dim: int) -> None:
        if self.compress == "mlp" and head_dim != self.head_dim:
            raise ValueError(
                f"{self.name}: option 'head_dim'={self.head_dim} must equal the inputs' head_dim "
                f"{head_dim} (the mlp compression maps blocks of head_dim channels)"
            )

    def attend(self, q, k, v, gates) -> torch.Tensor:
        self._check_head_dim(q.shape[-1])
        keys = self.compressed(k, self.key_mlp)  # (B, H, n, D)
        values = self.compressed(v, self.value_mlp)  # (B, H, n, D)
        out_cmp = CompressedBranch.apply(q, keys, values, self.block_size)  # (B, H, L, D)
        with torch.no_grad():
            selected = top_blocks(q, keys, self.block_size, self.n_select - 1, causal=True)
        out_sel = SelectedBlocks.apply(q, k, v, selected, self.block_size, True)
        out_win = WindowBranch.apply(q, k, v, self.window)
        g = gates.to(q.dtype)
        return g[..., 0:1] * out_cmp + g[..., 1:2] * out_sel + g[..., 2:3] * out_win

    # --- decoding: every key and value, and the compressed key and value of ended blocks ----
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        self._check_head_dim(head_dim)
        return BlockKVCache(
            self.name, batch_size, n_heads, head_dim, block=self.block_size,
            summarise_values=True, max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: BlockKVCache, gates) -> None:
        cache.append(k, v)
        ended = k.shape[2] // self.block_size * self.block_size
        if ended:
            cache.add_summaries(
                self.compressed(k[:, :, :ended], self.key_mlp),
                self.compressed(v[:, :, :ended], self.value_mlp),
            )

    def decode_step(self, q, k, v, cache: BlockKVCache, gates) -> torch.Tensor:
        cache.append(k, v)
        block = self.block_size
        if cache.length % block == 0:  # the own block ends here: the query sees its summary
            keys, values = cache.keys()[:, :, -block:], cache.values()[:, :, -block:]
            cache.add_summaries(
                self.compressed(keys, self.key_mlp), self.compressed(values, self.value_mlp)
            )
        summary_keys, summary_values = cache.summaries()  # (B, H, n, D) each
        out_cmp = attend_prefix(q, summary_keys, summary_values)  # 0 before the first block ends
        out_sel = attend_selected(q, cache, summary_keys, self.n_select - 1)
        first = max(0, cache.length - self.window)
        out_win = attend_prefix(q, cache.keys()[:, :, first:], cache.values()[:, :, first:])
        g = gates.to(q.dtype)  # (B, H, 1, 3)
        return g[..., 0:1] * out_cmp + g[..., 1:2] * out_sel + g[..., 2:3] * out_win

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """4 B H d x the pairs the three branches score (compressed: floor((i + 1) / b) per
        query; selected: own block causal plus up to n_select - 1 full blocks; window:
        min(i + 1, window)), plus the selection scores (2 B H d per query and earlier block)
        and, for `mlp`, the compression's 2 x 2 B H n (b d d + d d)."""
        b = self.block_size
        position = torch.arange(seq_len, dtype=torch.int64)
        compressed = int(((position + 1) // b).sum())
        window = int((position + 1).clamp(max=self.window).sum())
        selected, candidates = block_select_pairs(seq_len, b, self.n_select, True)
        total = 4 * batch * heads * head_dim * (compressed + selected + window)
        total += 2 * batch * heads * head_dim * candidates
        if self.compress == "mlp":
            n_blocks = -(-seq_len // b)
            total += 2 * 2 * batch * heads * n_blocks * (b * head_dim + head_dim) * head_dim
        return total

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, block_size={self.block_size}, n_select={self.n_select}, "
            f"window={self.window}, compress={self.compress}"
        )


class BlockMLP(nn.Module):
    """NSA's learned compression of a block: x_t + p_t for the block's b positions (learned
    intra-block position vectors p), flattened, Linear(b d, d), GELU, Linear(d, d).
    (B, H, L, d) -> (B, H, ceil(L / b), d); the short last block is zero-padded first."""

    def __init__(self, block_size: int, head_dim: int):
        super().__init__()
        self.block_size = block_size
        self.position = nn.Parameter(torch.zeros(block_size, head_dim))
        self.hidden = nn.Linear(block_size * head_dim, head_dim)
        self.out = nn.Linear(head_dim, head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = pad_to_multiple(x, self.block_size).unflatten(2, (-1, self.block_size))
        blocks = blocks + self.position  # (B, H, n, b, d)
        return self.out(F.gelu(self.hidden(blocks.flatten(3))))  # (B, H, n, d)


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
