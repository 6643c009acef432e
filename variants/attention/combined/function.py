"""The combined pattern's autograd function: the pieces of a `plan.Plan` attended on the fused
kernels and merged by logsumexp, and each piece's backward given the merged output and
logsumexp. With a key padding mask or segment ids every piece's bias also hides the pairs
`masking.document_mask` refuses (`Documents`), which makes it per sequence. k and v may have
fewer heads than q (grouped heads): they are read as they are, never repeated."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from variants.attention.combined.plan import Plan
from variants.attention.common import flash
from variants.attention.common.columns import from_columns, to_columns
from variants.attention.common.local import to_blocks
from variants.attention.common.masking import document_mask

# The tiles run over ranges of query blocks whose gathered keys and values take about this
# much: temporaries of a few MiB are reused between calls, where larger ones come back as fresh
# pages on every call (common/buffers.py says why).
CHUNK_BYTES = 8 * 2**20


class CombinedPieces(torch.autograd.Function):
    """The pieces of a `Plan` attended and merged by logsumexp; the backward runs each piece's
    attention backward given the merged output and logsumexp (`flash`), so nothing per pair is
    saved: q, k, v, the output and its logsumexp (O(L d))."""

    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, attention_mask=None, segment_ids=None):
        """q: (B, H, L, D); k, v: (B, H_kv, L, D), H_kv dividing H (query head h reads key
        head h // (H / H_kv)); attention_mask, segment_ids: (B, L) or None (folded into
        every piece's bias: `Documents`). Returns (B, H, L, D)."""
        documents = None
        if attention_mask is not None or segment_ids is not None:
            documents = Documents(attention_mask, segment_ids)
        pieces = Pieces(plan, q, documents, kv_heads=k.shape[1])
        out, lse = pieces.tiles_forward(q, k, v)  # (B, H, n*b, D), (B, H, n*b)
        view_out, view_lse = out[:, :, : plan.seq_len], lse[:, :, : plan.seq_len, None]
        if plan.stride is not None:
            pieces.strided_forward(q, k, v, view_out, view_lse)
        if plan.summary is not None:
            pieces.summary_forward(q, k, v, view_out, view_lse)
        if plan.global_rows:
            pieces.rows_forward(q, k, v, view_out, view_lse)
        # A row no piece gave a key has an lse of about MASKED_SCORE: its softmax is over
        # nothing, taken to be 0 (and no gradient flows through it). Masks can empty a row
        # only where the pattern leaves out the query itself (neither local nor strided).
        empty = view_lse[..., 0] < flash.masked_score(q.dtype) / 2  # (B, H, L)
        pieces.empty = empty if bool(empty.any()) else None
        if pieces.empty is not None:
            view_out[pieces.empty] = 0
        ctx.pieces = pieces
        ctx.save_for_backward(q, k, v, out, lse)
        return view_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        pieces, plan = ctx.pieces, ctx.pieces.plan
        length, rows = plan.seq_len, plan.global_rows
        grads = [torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)]
        # The global rows' gradient is their own piece's; every other piece sees zeros there.
        sparse = grad_out.clone(memory_format=torch.contiguous_format)  # (B, H, L, D)
        sparse[:, :, :rows] = 0
        if pieces.empty is not None:
            sparse[pieces.empty] = 0
        view_out, view_lse = out[:, :, :length], lse[:, :, :length]
        pieces.tiles_backward(sparse, q, k, v, out, lse, grads)
        if plan.stride is not None:
            pieces.strided_backward(sparse, q, k, v, view_out, view_lse, grads)
        if plan.summary is not None:
            pieces.summary_backward(sparse, q, k, v, view_out, view_lse, grads)
        if rows:
            pieces.rows_backward(grad_out, q, k, v, view_out, view_lse, grads)
        return *grads, None, None, None


class Documents:
    """One call's key padding mask and segment ids ((B, L) each, either None), as one more
    condition on a piece's pairs: `masking.document_mask` (same document; key real or the
    query itself), for every pair of every piece, global rows and columns included."""

    def __init__(self, attention_mask: torch.Tensor | None, segment_ids: torch.Tensor | None):
        self.attention_mask, self.segment_ids = attention_mask, segment_ids

    def hide(self, hidden: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """A piece's hidden pairs (uint8 or bool, nonzero = hidden, broadcastable to the pairs
        of positions `query` x `key`) with the refused pairs added: uint8 (B, *pairs)."""
        allowed = document_mask(self.attention_mask, self.segment_ids, query, key)
        return (~allowed).to(torch.uint8).bitwise_or_(hidden.to(torch.uint8))


class Pieces:
    """Each piece's forward (merging into the running output and logsumexp) and backward
    (adding into the gradients), for one call's shapes. With `documents`, each piece's bias
    is per sequence ((B, ...), or (B*H, ...) where a piece runs batch and heads flattened).

    The tiles and the strided piece put query blocks (or columns) on the fused kernels' head
    axis and batch and heads in their batch, so one bias serves every sequence and head. With
    grouped heads (`kv_heads` < H) the heads must be the kernels' head axis, where the kernels
    map query head h to key head h // (H / H_kv) (`flash.attend`): the tiles then run one
    sequence per call (query blocks as the batch, a view), the columns (B*s, H, rows, D), and
    their biases broadcast over the heads. The summary and global-rows pieces keep the heads
    on that axis either way.
    """

    def __init__(
        self,
        plan: Plan,
        q: torch.Tensor,
        documents: Documents | None = None,
        kv_heads: int | None = None,
    ):
        self.plan = plan
        self.documents = documents
        self.batch, self.heads, _, self.head_dim = q.shape
        self.kv_heads = self.heads if kv_heads is None else kv_heads
        self.grouped = self.kv_heads != self.heads
        self.scale = self.head_dim**-0.5
        self.empty = None
        slots = max(plan.tiles.shape[1], 1)
        per_call = 1 if self.grouped else self.batch  # sequences in one tile call
        per_block = 2 * per_call * self.kv_heads * slots * plan.block * self.head_dim
        if documents is not None:  # and the block's bias, per sequence (and head)
            bias_heads = 1 if self.grouped else self.heads
            per_block += self.batch * bias_heads * plan.block * slots * plan.block
        self.chunk = max(1, CHUNK_BYTES // (per_block * q.element_size()))

    def _per_head(self, bias: torch.Tensor) -> torch.Tensor:
        """A per-sequence bias (B, ...) as (B*H, ...), the batch layout of the pieces that
        flatten batch and heads (a copy: that dim cannot broadcast from B)."""
        return bias[:, None].expand(self.batch, self.heads, *bias.shape[1:]).flatten(0, 1)

    # --- tiles -----------------------------------------------------------------------------
    def _chunks(self):
        for first in range(0, self.plan.n_blocks, self.chunk):
            yield first, min(first + self.chunk, self.plan.n_blocks)

    def _sequences(self):
        """The tile calls of one range of query blocks: one for every sequence (None), or with
        grouped heads one per sequence (its index)."""
        return range(self.batch) if self.grouped else (None,)

    def _flat_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, L, D) -> (B*N, n, b*D) (grouped: (B, N, n, b*D)): a whole block per row, so
        that gathering tiles is one `index_select` along the block dim (along the block dim
        of a 5-d view it ran 5-9x slower)."""
        blocks = to_blocks(x, self.plan.block)  # (B, N, n, b, D)
        if self.grouped:
            return blocks.flatten(3)
        return blocks.reshape(self.batch * self.heads, self.plan.n_blocks, -1)

    def _gather(self, flat: torch.Tensor, first: int, end: int, seq: int | None) -> torch.Tensor:
        """The tiles of query blocks [first, end) from `_flat_blocks` keys or values:
        (B*H, m, K*b, D), one contiguous copy (grouped: sequence `seq`'s (m, H_kv, K*b, D), a
        view of one)."""
        index, m = self.plan.tiles[first:end].flatten(), end - first
        if seq is None:
            gathered = flat.index_select(1, index)  # (B*H, m*K, b*D)
            return gathered.view(self.batch * self.heads, m, -1, self.head_dim)
        gathered = flat[seq].index_select(1, index)  # (H_kv, m*K, b*D)
        return gathered.view(flat.shape[1], m, -1, self.head_dim).transpose(0, 1)

    def _query_blocks(self, x: torch.Tensor, first: int, end: int, seq: int | None):
        """(B, H, n, b, E) -> blocks [first, end) as (B*H, m, b, E) (grouped: sequence
        `seq`'s (m, H, b, E), a view)."""
        if seq is None:
            return x[:, :, first:end].reshape(self.batch * self.heads, end - first, *x.shape[3:])
        return x[seq, :, first:end].transpose(0, 1)

    def _put_blocks(self, blocks: torch.Tensor, chunk: torch.Tensor, first, end, seq) -> None:
        """Write a tile call's (B*H, m, b, E) (grouped: (m, H, b, E)) result into blocks
        [first, end) of `blocks` (B, H, n, b, E)."""
        if seq is None:
            blocks[:, :, first:end] = chunk.view(self.batch, self.heads, *chunk.shape[1:])
        else:
            blocks[seq, :, first:end] = chunk.transpose(0, 1)

    def _add_tiles(self, total: torch.Tensor, chunk: torch.Tensor, first, end, seq) -> None:
        """Add a tile call's key or value gradient (B*H, m, K*b, D) (grouped: (m, H_kv, K*b,
        D)) into the `_flat_blocks` gradient `total`, at the blocks the tiles gathered."""
        index, width = self.plan.tiles[first:end].flatten(), self.plan.block * self.head_dim
        if seq is None:
            total.index_add_(1, index, chunk.reshape(self.batch * self.heads, -1, width))
        else:
            total[seq].index_add_(1, index, chunk.transpose(0, 1).reshape(self.kv_heads, -1, width))

    def _tile_biases(self, first: int, end: int, dtype: torch.dtype) -> list:
        """The bias of each of `_sequences` for query blocks [first, end) against their tiles:
        the plan's (1, m, b, K*b) or None, or with documents (B*H, m, b, K*b) (FULL slots then
        masked too); grouped, the plan's as (m, 1, b, K*b) and a sequence's as (m, 1, b, K*b)."""
        if self.documents is None:
            bias = self.plan.tile_bias(first, end, dtype)
            if self.grouped and bias is not None:
                bias = bias.transpose(0, 1)  # (m, 1, b, K*b)
            return [bias for _ in self._sequences()]
        query, key = self.plan.tile_positions(first, end)  # (m, b, 1), (m, 1, K*b)
        hidden = self.documents.hide(self.plan.hidden[first:end], query, key)  # (B, m, b, K*b)
        bias = flash.hidden_bias(hidden, dtype)
        if self.grouped:
            return [bias[seq][:, None] for seq in self._sequences()]
        return [self._per_head(bias)]

    def tiles_forward(self, q, k, v):
        """The tile piece over the padded length: out (B, H, n*b, D), lse (B, H, n*b)."""
        plan, b = self.plan, self.plan.block
        lse_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        out = q.new_zeros(self.batch, self.heads, plan.n_blocks * b, self.head_dim)
        lse = torch.full(
            out.shape[:3], flash.masked_score(q.dtype), dtype=lse_dtype, device=q.device
        )
        if plan.tile_pattern is None:
            return out, lse
        q_blocks = to_blocks(q, b)  # (B, H, n, b, D)
        k_flat, v_flat = self._flat_blocks(k), self._flat_blocks(v)  # (B*H, n, b*D)
        out_blocks = out.view(self.batch, self.heads, plan.n_blocks, b, self.head_dim)
        lse_blocks = lse.view(self.batch, self.heads, plan.n_blocks, b)
        for first, end in self._chunks():
            biases = self._tile_biases(first, end, q.dtype)
            for seq, bias in zip(self._sequences(), biases, strict=True):
                chunk_out, chunk_lse = flash.attend(
                    self._query_blocks(q_blocks, first, end, seq),
                    self._gather(k_flat, first, end, seq),
                    self._gather(v_flat, first, end, seq),
                    scale=self.scale,
                    bias=bias,
                )  # (B*H, m, b, D), (B*H, m, b) (grouped: (m, H, b, .))
                self._put_blocks(out_blocks, chunk_out, first, end, seq)
                self._put_blocks(lse_blocks, chunk_lse, first, end, seq)
        return out, lse

    def tiles_backward(self, grad, q, k, v, out, lse, grads):
        plan, b = self.plan, self.plan.block
        if plan.tile_pattern is None:
            return
        q_blocks, grad_blocks = to_blocks(q, b), to_blocks(grad, b)  # (B, H, n, b, D)
        k_flat, v_flat = self._flat_blocks(k), self._flat_blocks(v)  # (B*H, n, b*D)
        out_blocks = out.view(self.batch, self.heads, plan.n_blocks, b, self.head_dim)
        lse_blocks = lse.view(self.batch, self.heads, plan.n_blocks, b, 1)
        grad_q = torch.zeros_like(q_blocks, memory_format=torch.contiguous_format)
        grad_k, grad_v = torch.zeros_like(k_flat), torch.zeros_like(v_flat)  # (B*H, n, b*D)
        for first, end in self._chunks():
            biases = self._tile_biases(first, end, q.dtype)
            for seq, bias in zip(self._sequences(), biases, strict=True):
                chunk_q, chunk_k, chunk_v = flash.attend_backward(
                    self._query_blocks(grad_blocks, first, end, seq),
                    self._query_blocks(q_blocks, first, end, seq),
                    self._gather(k_flat, first, end, seq),
                    self._gather(v_flat, first, end, seq),
                    self._query_blocks(out_blocks, first, end, seq),
                    self._query_blocks(lse_blocks, first, end, seq).squeeze(-1),
                    scale=self.scale,
                    bias=bias,
                )  # (B*H, m, b, D), (B*H, m, K*b, D) twice (grouped: (m, H or H_kv, ., D))
                self._put_blocks(grad_q, chunk_q, first, end, seq)
                self._add_tiles(grad_k, chunk_k, first, end, seq)
                self._add_tiles(grad_v, chunk_v, first, end, seq)
        length, shape = plan.seq_len, (self.batch, self.kv_heads, -1, self.head_dim)
        grads[0] += grad_q.flatten(2, 3)[:, :, :length]
        grads[1] += grad_k.view(shape)[:, :, :length]
        grads[2] += grad_v.view(shape)[:, :, :length]

    # --- strided -----------------------------------------------------------------------------
    def _strided_options(self, q):
        plan, stride = self.plan, self.plan.stride
        if self.documents is not None:
            return {"scale": self.scale, "bias": self._strided_bias(q)}
        if plan.causal:
            return {"scale": self.scale, "causal": True}
        rows = -(-plan.seq_len // stride)
        if rows * stride == plan.seq_len:
            return {"scale": self.scale}
        # Unmasked, a column's query sees every real row of it: hide the padded keys.
        position = self._column_positions(q.device)
        hidden = (position >= plan.seq_len)[None, :, None, :]  # (1, s, 1, rows)
        return {"scale": self.scale, "bias": self._column_bias(flash.hidden_bias(hidden, q.dtype))}

    def _column_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """A bias over columns, (1 or B, s, ., rows), in the layout of `_columns`: as it is
        or (B*H, s, ., rows) for a per-sequence one (grouped: (B*s, 1, ., rows))."""
        if self.grouped:
            return bias.expand(self.batch, *bias.shape[1:]).flatten(0, 1)[:, None]
        return bias if bias.shape[0] == 1 else self._per_head(bias)

    def _columns(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, L, E) -> (B*N, s, rows, E), column c holding positions c, c + s, ...
        (grouped: (B*s, N, rows, E)); contiguous."""
        columns = to_columns(x, self.plan.stride)  # (B*N, s, rows, E)
        if self.grouped:
            return columns.unflatten(0, (self.batch, -1)).transpose(1, 2).flatten(0, 1)
        return columns.contiguous()

    def _from_columns(self, x: torch.Tensor) -> torch.Tensor:
        """Undo `_columns`: -> (B, N, rows * s, E), N the heads x holds (padding kept)."""
        if self.grouped:
            x = x.unflatten(0, (self.batch, -1)).transpose(1, 2).flatten(0, 1)  # (B*N, s, ...)
        return from_columns(x, self.batch, x.shape[0] // self.batch)

    def _column_positions(self, device) -> torch.Tensor:
        """(s, rows): the position of row r of column c, r * s + c (L and beyond: padding)."""
        stride, rows = self.plan.stride, -(-self.plan.seq_len // self.plan.stride)
        position = torch.arange(rows, device=device) * stride
        return position[None, :] + torch.arange(stride, device=device)[:, None]

    def _strided_bias(self, q) -> torch.Tensor:
        """The strided piece's bias with documents: (B*H, s, rows, rows), hiding padding rows,
        later rows when causal, and the pairs `Documents` refuses."""
        position = self._column_positions(q.device)
        query, key = position[:, :, None], position[:, None, :]  # (s, rows, 1), (s, 1, rows)
        hidden = key >= self.plan.seq_len  # (s, 1, rows)
        if self.plan.causal:
            hidden = hidden | (key > query)  # (s, rows, rows)
        hidden = self.documents.hide(hidden, query, key)  # (B, s, rows, rows)
        return self._column_bias(flash.hidden_bias(hidden, q.dtype))

    def strided_forward(self, q, k, v, out, lse):
        length = self.plan.seq_len
        columns = (self._columns(x) for x in (q, k, v))  # (B*H, s, rows, D)
        part_out, part_lse = flash.attend(*columns, **self._strided_options(q))
        part_out = self._from_columns(part_out)[:, :, :length]
        part_lse = self._from_columns(part_lse.unsqueeze(-1))[:, :, :length]
        flash.merge_into(out, lse, part_out, part_lse)

    def strided_backward(self, grad, q, k, v, out, lse, grads):
        length = self.plan.seq_len
        columns = [self._columns(x) for x in (grad, q, k, v, out)]
        lse_columns = self._columns(lse.unsqueeze(-1)).squeeze(-1)
        pieces = flash.attend_backward(*columns, lse_columns, **self._strided_options(q))
        for total, piece in zip(grads, pieces, strict=True):
            total += self._from_columns(piece)[:, :, :length]

    # --- summary -----------------------------------------------------------------------------
    def _summary_calls(self, q):
        """Per query block of the summary pattern: (its rows, how many summary keys from the
        start it sees, their bias: (1, 1, 1, C) hiding its own block's keys, or None; with
        documents (B, 1, r, C))."""
        for rows, count, hidden in self._summary_blocks(q):
            yield rows, count, self._summary_bias(q, rows, count, hidden)

    def _summary_bias(self, q, rows: slice, count: int, hidden: torch.Tensor | None):
        """The bias of one query block's summary call from its hidden keys (bool (C,) or
        None): see `_summary_calls`."""
        if self.documents is None:
            if hidden is None:
                return None
            return flash.hidden_bias(hidden, q.dtype).view(1, 1, 1, count)
        if hidden is None:
            hidden = torch.zeros(count, dtype=torch.bool, device=q.device)
        query = torch.arange(rows.start, rows.stop, device=q.device)[:, None]  # (r, 1)
        key = self.plan.summary_keys[None, :count]  # (1, C)
        hidden = self.documents.hide(hidden, query, key)  # (B, r, C)
        return flash.hidden_bias(hidden, q.dtype)[:, None]  # (B, 1, r, C), broadcast over H

    def _summary_blocks(self, q):
        """Per query block of the summary pattern: (its rows, how many summary keys from the
        start it sees, which of them are its own block's (bool (C,), hidden) or None)."""
        plan, summary = self.plan, self.plan.summary
        block, n_keys = summary.block_size, len(plan.summary_keys)
        for first in range(0, plan.seq_len, block):
            rows = slice(first, min(first + block, plan.seq_len))
            before = int(summary.count_before(torch.tensor(first)))
            if plan.causal:
                if before:
                    yield rows, before, None
                continue
            own = int(summary.count_before(torch.tensor(rows.stop))) - before
            if own == n_keys:
                continue
            hidden = torch.zeros(n_keys, dtype=torch.bool, device=q.device)
            hidden[before : before + own] = True
            yield rows, n_keys, hidden

    def summary_forward(self, q, k, v, out, lse):
        keys, values = (x.index_select(2, self.plan.summary_keys) for x in (k, v))
        for rows, count, bias in self._summary_calls(q):
            part_out, part_lse = flash.attend(
                q[:, :, rows], keys[:, :, :count], values[:, :, :count], scale=self.scale, bias=bias
            )  # (B, H, r, D), (B, H, r)
            flash.merge_into(out[:, :, rows], lse[:, :, rows], part_out, part_lse.unsqueeze(-1))

    def summary_backward(self, grad, q, k, v, out, lse, grads):
        index = self.plan.summary_keys
        keys, values = (x.index_select(2, index) for x in (k, v))  # (B, H, C, D)
        grad_keys, grad_values = torch.zeros_like(keys), torch.zeros_like(values)
        for rows, count, bias in self._summary_calls(q):
            grad_q, grad_k, grad_v = flash.attend_backward(
                grad[:, :, rows].contiguous(),
                q[:, :, rows],
                keys[:, :, :count],
                values[:, :, :count],
                out[:, :, rows].contiguous(),
                lse[:, :, rows].contiguous(),
                scale=self.scale,
                bias=bias,
            )
            grads[0][:, :, rows] += grad_q
            grad_keys[:, :, :count] += grad_k
            grad_values[:, :, :count] += grad_v
        grads[1].index_add_(2, index, grad_keys)
        grads[2].index_add_(2, index, grad_values)

    # --- global rows -------------------------------------------------------------------------
    def _rows_bias(self, q) -> torch.Tensor | None:
        """The global rows' bias: None (every key), or with documents (B, 1, n_global, L):
        a global query, too, sees only its document's real keys."""
        if self.documents is None:
            return None
        positions = torch.arange(self.plan.seq_len, device=q.device)
        query, key = positions[: self.plan.global_rows, None], positions[None, :]  # (g, 1), (1, L)
        hidden = torch.zeros((), dtype=torch.uint8, device=q.device)
        return flash.hidden_bias(self.documents.hide(hidden, query, key), q.dtype)[:, None]

    def rows_forward(self, q, k, v, out, lse):
        rows = self.plan.global_rows
        part_out, part_lse = flash.attend(
            q[:, :, :rows], k, v, scale=self.scale, bias=self._rows_bias(q)
        )  # (B, H, g, D), (B, H, g)
        out[:, :, :rows] = part_out  # every key these rows may see: nothing to merge
        lse[:, :, :rows, 0] = part_lse

    def rows_backward(self, grad, q, k, v, out, lse, grads):
        rows = self.plan.global_rows
        grad_q, grad_k, grad_v = flash.attend_backward(
            grad[:, :, :rows].contiguous(),
            q[:, :, :rows],
            k,
            v,
            out[:, :, :rows].contiguous(),
            lse[:, :, :rows].contiguous(),
            scale=self.scale,
            bias=self._rows_bias(q),
        )
        grads[0][:, :, :rows] += grad_q
        grads[1] += grad_k
        grads[2] += grad_v
