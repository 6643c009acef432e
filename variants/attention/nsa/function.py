"""NSA's autograd functions: the compressed branch (queries over the compressed keys of the
blocks that ended before them) and the window branch (query tiles against an overlapping
window of keys), each with its flash backward; and the gated sum of the three branches."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from variants.attention.common import flash
from variants.attention.common.masking import document_mask

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

    q: (B, H, L, D); keys, values: (B, H_kv, n, D), H_kv dividing H (grouped KV heads, which
    the fused calls take as they are). Returns (B, H, L, D). Rows run in ranges of
    ROWS, each against the first m of its last row (fused attention with a bias hiding the
    blocks a row may not see yet); the backward is the same calls' attention backward.

    docs: a `selection.DocumentBlocks` under the masks, or None: then block c is read by real
    query i only if it also lies wholly in i's document and holds a real key (`whole`); a row
    left without any block gives 0 (and passes no gradient). A row range where that hides no
    block from a real query runs as without masks (a padded query's output is 0 whatever its
    row reads, so its row hides nothing more than the causal rule).
    """

    @staticmethod
    def forward(ctx, q, keys, values, block, docs=None):
        out = torch.zeros_like(q, memory_format=torch.contiguous_format)
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        lse = torch.zeros(q.shape[:3], dtype=lse_dtype, device=q.device)
        for rows, count, bias, empty in _row_ranges(q, block, docs):
            part_out, part_lse = flash.attend(
                q[:, :, rows], keys[:, :, :count], values[:, :, :count], scale=_scale(q), bias=bias
            )
            if empty is not None:  # all hidden: the kernel's average of hidden values, not 0
                part_out = part_out.masked_fill(empty, 0.0)
            out[:, :, rows], lse[:, :, rows] = part_out, part_lse
        ctx.block, ctx.docs = block, docs
        ctx.save_for_backward(q, keys, values, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, keys, values, out, lse = ctx.saved_tensors
        grad_q = torch.zeros_like(q, memory_format=torch.contiguous_format)
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)
        for rows, count, bias, empty in _row_ranges(q, ctx.block, ctx.docs):
            grad_rows = grad_out[:, :, rows]
            if empty is not None:  # rows that read no block: their output is a constant 0
                grad_rows = grad_rows.masked_fill(empty, 0.0)
            dq, dk, dv = flash.attend_backward(
                grad_rows.contiguous(),
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
        return grad_q, grad_keys, grad_values, None, None


def _scale(q: torch.Tensor) -> float:
    return q.shape[-1] ** -0.5


def _row_ranges(q: torch.Tensor, block: int, docs=None):
    """(rows, m, bias, empty): ranges of at most ROWS query rows that see at least one block,
    the blocks the range's last row sees, and the bias hiding block c from row i where
    c >= floor((i + 1) / b) (None when every row sees all m); empty is None. With `docs`
    (`CompressedBranch`), where `docs.outside` hides a block that the causal rule shows to a
    real query of the range, the bias (B, 1, r, m) also hides those blocks, and empty
    (B, 1, r, 1) says which rows then read no block; elsewhere the range's call is the one
    without masks."""
    length = q.shape[2]
    for first in range(block - 1, length, ROWS):  # rows before b - 1 see nothing: output 0
        rows = slice(first, min(first + ROWS, length))
        count = rows.stop // block  # floor((last + 1) / b)
        position = torch.arange(rows.start, rows.stop, device=q.device)
        blocks = torch.arange(count, device=q.device)
        hidden = blocks[None, :] >= ((position + 1) // block)[:, None]  # (r, m)
        outside = None if docs is None else docs.outside(rows, count)  # (B, r, m)
        if outside is not None and bool((outside & ~hidden).any()):  # hides one causal shows
            hidden = hidden | outside  # (B, r, m)
            empty = hidden.all(dim=-1)[:, None, :, None]  # (B, 1, r, 1)
            yield rows, count, flash.hidden_bias(hidden[:, None], q.dtype), empty
            continue
        bias = flash.hidden_bias(hidden, q.dtype)[None, None] if bool(hidden.any()) else None
        yield rows, count, bias, None


class WindowBranch(torch.autograd.Function):
    """Each query at i over the keys i - window < j <= i, no gather and no padded copy: the
    first ceil(window / rows) tiles of WINDOW_ROWS queries in one call against the keys before
    their end (a band bias), then tiles of full windows, each tile against the window + rows
    keys that end at its last row (an overlapping view of the keys, one band bias for all),
    then the short last tile, if any. The backward adds each tile's key and value gradients
    back where the tiles overlap.

    q: (B, H, L, D), k, v: (B, H_kv, L, D); returns (B, H, L, D). Saves q, k, v, the output
    and logsumexp: O(L d). Grouped KV heads (H_kv < H) run one (sequence, KV head) per call,
    its G query heads as the fused kernel's heads and the tiles as its batch (strided views:
    the keys are never repeated). attention_mask, segment_ids: (B, L) or None (`masking`):
    every pair must also pass `masking.document_mask`, the calls' biases then one per sequence
    and head, in the calls where it hides a pair of the band from a real query (a padded
    query's output is 0 whatever it reads: its row keeps the band); the other calls run as
    without masks.
    """

    @staticmethod
    def forward(ctx, q, k, v, window, attention_mask=None, segment_ids=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        tiles = _WindowTiles(q, window, attention_mask, segment_ids, kv_heads=k.shape[1])
        out = torch.empty_like(q)  # (B, H, L, D)
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        lse = torch.empty(q.shape[:3], dtype=lse_dtype, device=q.device)  # (B, H, L)
        for call in tiles.calls():
            for rows, keys, bias in tiles.views(call):
                part_out, part_lse = flash.attend(
                    rows(q), keys(k), keys(v), scale=_scale(q), bias=bias
                )  # (B*H, m, rows, D), (B*H, m, rows); grouped (m, G, rows, *)
                rows(out).copy_(part_out)
                rows(lse).copy_(part_lse)
        ctx.tiles = tiles
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_q = torch.empty_like(q)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        tiles = ctx.tiles
        for call in tiles.calls():
            for rows, keys, bias in tiles.views(call):
                dq, dk, dv = flash.attend_backward(
                    rows(grad_out),
                    rows(q),
                    keys(k),
                    keys(v),
                    rows(out),
                    rows(lse),
                    scale=_scale(q),
                    bias=bias,
                )  # (B*H, m, rows, D), (B*H, m, width, D) twice; grouped (m, G or 1, *, D)
                rows(grad_q).copy_(dq)
                call.add_keys(keys(grad_k), dk)
                call.add_keys(keys(grad_v), dv)
        return grad_q, grad_k, grad_v, None, None, None


class _WindowTiles:
    """The calls of `WindowBranch` at one shape. With w = min(window, L) (more is never
    visible) and r = min(WINDOW_ROWS, L) rows per tile: the head, queries [0, h) with
    h = min(L, ceil(w / r) r), against keys [0, h); then chunks of full tiles, tile t holding
    queries [t r, (t + 1) r) and keys [t r - w, (t + 1) r), which start at or after 0 since
    t r >= h >= w; then the last L mod r queries against the w keys before them and
    themselves. Under masks (`WindowBranch`) each call's band also hides the pairs
    `masking.document_mask` does from a real query, if it hides one there."""

    def __init__(
        self, q: torch.Tensor, window: int, attention_mask=None, segment_ids=None, kv_heads=None
    ):
        batch, heads, self.length, head_dim = q.shape
        self.batch, self.heads = batch, heads
        self.kv_heads = heads if kv_heads is None else kv_heads
        self.group = heads // self.kv_heads
        self.masks = None
        if attention_mask is not None or segment_ids is not None:
            self.masks = {"attention_mask": attention_mask, "segment_ids": segment_ids}
        self.window = min(window, self.length)
        self.rows = min(WINDOW_ROWS, self.length)
        self.head = min(self.length, -(-self.window // self.rows) * self.rows)
        width = self.window + self.rows  # keys per full tile
        # One call's key and value gradients per tile: of every head, or (grouped) of one KV
        # head's group of G
        per_tile = 2 * (batch * heads if self.group == 1 else self.group)
        per_tile *= width * head_dim * q.element_size()
        self.chunk = max(1, WINDOW_CHUNK_BYTES // per_tile)
        self.device = q.device
        self.dtype = q.dtype

    def calls(self):
        """The calls in position order: each a `_WindowCall`."""
        w, r = self.window, self.rows
        yield self._call(0, 1, self.head, 0, self.head, self._band(self.head, self.head, 0))
        full_end = self.length // r * r
        band = self._band(r, w + r, w)
        for first in range(self.head, full_end, self.chunk * r):
            n_tiles = min(self.chunk, (full_end - first) // r)
            yield self._call(first, n_tiles, r, -w, w + r, band)
        if self.head < self.length and full_end < self.length:
            tail = self.length - full_end
            yield self._call(full_end, 1, tail, -w, w + tail, self._band(tail, w + tail, w))

    def _call(self, first, n_tiles, n_rows, offset, width, band) -> _WindowCall:
        """A `_WindowCall` with the `band` bias (1, 1, rows, width), or under masks, if they
        hide a pair of the band from a real query, its own bias: the band's hidden pairs and
        those `document_mask` hides from real queries, (B*H, m, rows, width)."""
        call = _WindowCall(first, n_tiles, n_rows, offset, width, band)
        if self.masks is None:
            return call
        tile_first = first + torch.arange(n_tiles, device=self.device)[:, None, None] * n_rows
        query = tile_first + torch.arange(n_rows, device=self.device)[:, None]  # (m, rows, 1)
        key = tile_first + offset + torch.arange(width, device=self.device)  # (m, 1, width)
        hidden = ~document_mask(**self.masks, query=query, key=key)  # (B, m, rows, width)
        keep = self.masks["attention_mask"]
        if keep is not None:  # a padded query's row: its output is 0, the band will do
            hidden &= keep[:, query.reshape(-1)].view(keep.shape[0], *query.shape)
        if not bool((hidden & (band[0] == 0)).any()):
            return call  # nothing the band shows is hidden: the call without masks
        bias = torch.minimum(flash.hidden_bias(hidden, self.dtype), band[0])  # either hides
        call.sequence_bias = bias  # (B, m, rows, width)
        call.bias = bias[:, None].expand(-1, self.heads, -1, -1, -1).flatten(0, 1)
        return call

    def views(self, call: _WindowCall):
        """The fused calls of `call`: (rows, keys, bias) each, `rows` and `keys` mapping a
        (B, H or H_kv, L, ...) tensor to the call's views. One over every head, or (grouped)
        one per (sequence, KV head), its bias per sequence."""
        if self.group == 1:
            yield call.rows, call.keys, call.bias
            return
        for b in range(self.batch):
            bias = call.bias
            if call.sequence_bias is not None:
                bias = call.sequence_bias[b][:, None]  # (m, 1, rows, width): over the group
            for h in range(self.kv_heads):
                heads = slice(h * self.group, (h + 1) * self.group)

                def rows(x, b=b, heads=heads):
                    return call.group_rows(x[b, heads])

                def keys(x, b=b, h=h):
                    return call.keys(x[b : b + 1, h : h + 1]).transpose(0, 1)  # (m, 1, w, D)

                yield rows, keys, bias

    def _band(self, rows: int, width: int, offset: int) -> torch.Tensor:
        """Bias hiding, from query row i (position first + i), key column c (position first -
        offset + c) unless i - w < c - offset <= i: (1, 1, rows, width)."""
        row = torch.arange(rows, device=self.device)[:, None]
        column = torch.arange(width, device=self.device)[None, :] - offset
        hidden = (column > row) | (column <= row - self.window)  # (rows, width)
        return flash.hidden_bias(hidden, self.dtype)[None, None]


class _WindowCall:
    """One fused call of `WindowBranch`: `n_tiles` tiles of `n_rows` queries from position
    `first` on, tile j holding queries [first + j n_rows, first + (j + 1) n_rows) and the
    `width` keys from its first query + `offset` on (offset <= 0), `bias` for every tile."""

    def __init__(self, first, n_tiles, n_rows, offset, width, bias):
        self.first, self.n_tiles, self.n_rows = first, n_tiles, n_rows
        self.offset, self.width, self.bias = offset, width, bias
        self.sequence_bias = None  # under masks, per sequence: (B, m, rows, width)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The call's queries of x (B, H, L, ...), contiguous: (B*H, m, rows, ...) view."""
        tail = x.shape[3:]
        flat = x.reshape(-1, x.shape[2], *tail)  # (B*H, L, ...)
        span = flat[:, self.first : self.first + self.n_tiles * self.n_rows]
        return span.view(flat.shape[0], self.n_tiles, self.n_rows, *tail)

    def group_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The call's queries of one sequence's heads x (G, L, ...), a slice of a contiguous
        tensor: (m, G, rows, ...) view, the tiles as the batch."""
        inner = x[0, 0].numel()
        shape = (self.n_tiles, x.shape[0], self.n_rows, *x.shape[2:])
        strides = (self.n_rows * inner, *x.stride())
        return x.as_strided(shape, strides, x.storage_offset() + self.first * inner)

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """The tiles' keys of x (B, H, L, D), contiguous (or a slice of whole sequences of a
        contiguous tensor): an overlapping view (B*H, m, width, D)."""
        flat = x.view(-1, x.shape[2], x.shape[3])  # (B*H, L, D)
        d = x.shape[3]
        start = self.first + self.offset
        shape = (flat.shape[0], self.n_tiles, self.width, d)
        strides = (flat.stride(0), self.n_rows * d, d, 1)
        return flat.as_strided(shape, strides, flat.storage_offset() + start * d)

    def add_keys(self, view: torch.Tensor, tiles: torch.Tensor) -> None:
        """Add the tiles' key gradients (B*H, m, width, D) into `view`, the `keys` view of the
        total (B, H, L, D), in slices of n_rows columns (no slice overlaps another of the same
        tile)."""
        for start in range(0, self.width, self.n_rows):
            end = min(start + self.n_rows, self.width)
            view[:, :, start:end].add_(tiles[:, :, start:end])


class GatedSum(torch.autograd.Function):
    """sum_i gates[..., i] * outputs[i]: the branches' outputs (B, H, L, D) each, gates
    (B, H, L, n) with n = the number of outputs. One fresh output in the forward and one
    temporary reused by the backward (autograd's multiply-and-add leaves one per term, each
    a large tensor's page faults)."""

    @staticmethod
    def forward(ctx, gates, *outputs):
        out = outputs[0] * gates[..., 0:1]
        for i, branch in enumerate(outputs[1:], start=1):
            out.addcmul_(branch, gates[..., i : i + 1])
        ctx.save_for_backward(gates, *outputs)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        gates, *outputs = ctx.saved_tensors
        grad_gates = None
        if ctx.needs_input_grad[0]:  # the kernel timed alone passes gates without gradient
            grad_gates = torch.empty_like(gates)
            product = torch.empty_like(grad)
            for i, branch in enumerate(outputs):
                torch.sum(torch.mul(grad, branch, out=product), dim=-1, out=grad_gates[..., i])
        grad_outputs = [
            grad * gates[..., i : i + 1] if ctx.needs_input_grad[i + 1] else None
            for i in range(len(outputs))
        ]
        return grad_gates, *grad_outputs
