"""MoBA's autograd function, also NSA's selected branch: each query over its own block and the
blocks `selection` chose, merged by logsumexp; the backward runs each piece's attention backward
given the merged output and logsumexp (how the tiles run: docs/variants/moba.md)."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from variants.attention.common import flash
from variants.attention.common.base import pad_to_multiple
from variants.attention.common.local import to_blocks
from variants.attention.common.masking import document_mask

# Bytes of gathered keys and values per fused call over tiles (as combined.function.CHUNK_BYTES).
CHUNK_BYTES = 8 * 2**20


# Query rows per tile: one block's queries are cut into tiles of this many (the last one
# padded); longer tiles mean fewer, larger attention calls for the fused kernel.
TILE_ROWS = 256


# The largest log-weight a part gets in the running merge (`_Plan.tiles_forward`): weights
# stay at most exp(20) ~ 5e8 of their query's reference, far from overflow in float32.
SHIFT_LIMIT = 20.0


class SelectedBlocks(torch.autograd.Function):
    """Softmax attention of each query over its own block (causal inside it when causal) and
    the key blocks `selected` names, merged by logsumexp (docs/variants/moba.md: how it runs).

    q: (B, H, L, D); k, v: (B, H_kv, L, D), H_kv dividing H (grouped KV heads: query head h
    reads KV head h // (H / H_kv); the own blocks run a KV head's G query heads as the fused
    kernel's heads, the tiles gather the queries of all G heads that chose a block); selected:
    (B, H, L, S) int64 block indices (-1: none), each other than the query's own block and,
    when causal, before it. Returns (B, H, L, D). Saves q, k, v, the selection, the merged
    output and its logsumexp: O(L (S + d)).

    attention_mask, segment_ids: (B, L) or None (`masking`): every (query, key) pair, in the
    own block and in the selected ones, must also pass `masking.document_mask`. Only where it
    can hide a pair is it a bias: a clean block (every position real, one document) runs as
    without masks, as its own block (the kernels' causal flag) and in a tile whose queries
    are all of its document; the other own blocks take their causal rule and the document
    mask in a bias (one per sequence and head), the other tiles the document mask. A selected
    block should hold at least one such key (the routing's job): a part without any weighs 0
    in the merge.
    """

    @staticmethod
    def forward(ctx, q, k, v, selected, block, causal, attention_mask=None, segment_ids=None):
        plan = _Plan(q, k.shape[1], selected, block, causal, attention_mask, segment_ids)
        out, lse = plan.own_forward(q, k, v)  # (B, H, L, D), (B, H, L)
        if plan.n_entries:
            out, lse = plan.tiles_forward(q, k, v, out, lse)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        grad_out = grad_out.contiguous()
        grads = plan.own_backward(grad_out, q, k, v, out, lse)
        if plan.n_entries:
            plan.tiles_backward(grad_out, q, k, v, out, lse, grads)
        return *grads, None, None, None, None, None


class _Plan:
    """The tiles of one call: every valid (query, selected block) pair, sorted by (sequence,
    block), each block's queries cut into tiles of `block` rows. A key sequence is a (batch
    row, KV head) pair: `kv_heads` of them per batch row."""

    def __init__(
        self,
        q: torch.Tensor,
        kv_heads: int,
        selected: torch.Tensor,
        block: int,
        causal: bool,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ):
        self.batch, self.heads, self.length, self.head_dim = q.shape
        self.dtype, self.device = q.dtype, q.device
        self.kv_heads, self.group = kv_heads, self.heads // kv_heads
        self.block, self.causal = block, causal
        self.masks = None  # the masks flattened to (1, B*L): positions b*L + i (`_tile_hidden`)
        self.n_blocks = -(-self.length // block)
        if attention_mask is not None or segment_ids is not None:
            self.masks = {
                "attention_mask": _flat(attention_mask),
                "segment_ids": _flat(segment_ids),
            }
            # (B, n): blocks whose `document_mask` hides nothing from a query of their document
            self.clean = _clean_blocks(attention_mask, segment_ids, block)
            self.own_clean = self._own_clean()
        self.scale = self.head_dim**-0.5
        n_seq = self.batch * self.kv_heads  # key sequences
        flat = selected.reshape(-1)  # (S'*L*S,)
        entry = (flat >= 0).nonzero().squeeze(1)  # (E,) index into (S', L, S)
        self.n_entries = entry.numel()
        if not self.n_entries:
            return
        query = entry // selected.shape[-1]  # (E,) query row of (S'*L)
        sequence = query // self.length // self.group  # (E,) b H_kv + h // G
        group = sequence * self.n_blocks + flat[entry]  # (E,) key block of sequence
        group, order = torch.sort(group, stable=True)
        query = query[order]
        counts = torch.bincount(group, minlength=n_seq * self.n_blocks)  # (G,)
        rows = self.rows = TILE_ROWS
        tiles_per_group = -(-counts // rows)
        self.n_tiles = int(tiles_per_group.sum())
        self.tile_group = torch.repeat_interleave(
            torch.arange(counts.numel(), device=q.device), tiles_per_group
        )  # (T,)
        # Each tile row's query row in (S'*L); a tile's rows past its group's last entry
        # (`unused`) repeat row 0 and are weighted out of every sum. The entries of a group are
        # consecutive: entry e goes to row e - (first entry of its group) of its first tile.
        tile_start = tiles_per_group.cumsum(0) - tiles_per_group
        shift = tile_start * rows - (counts.cumsum(0) - counts)  # (G,)
        slot = torch.arange(self.n_entries, device=q.device) + shift[group]  # (E,)
        self.row_query = torch.zeros(self.n_tiles * rows, dtype=torch.long, device=q.device)
        self.row_query[slot] = query  # (T*rows,)
        self.unused = torch.ones(self.n_tiles * rows, dtype=torch.bool, device=q.device)
        self.unused[slot] = False  # (T*rows,)
        if not causal and self.length % block:
            # Bidirectionally the short last block's padded keys must be hidden.
            last = (self.tile_group % self.n_blocks) == self.n_blocks - 1  # (T,)
            pad = torch.arange(block, device=q.device) >= self.length - (self.n_blocks - 1) * block
            self.hidden = (last[:, None] & pad[None, :]).to(torch.uint8)  # (T, b)
        else:
            self.hidden = None
        self.n_clean = self.n_tiles  # tiles [0, n_clean) need no document mask
        if self.masks is not None:
            self._clean_tiles_first(attention_mask, segment_ids)
        per_tile = (2 * block + 2 * rows) * self.head_dim * q.element_size()
        self.chunk = max(1, CHUNK_BYTES // per_tile)

    def _clean_tiles_first(self, attention_mask, segment_ids) -> None:
        """Reorder the tiles so that those `document_mask` hides nothing in come first, the
        first `n_clean`: a clean key block (all real, one document) and every query of the
        tile of its document (MoBA's routing picks no other). Their chunks then take no
        document bias (`_tile_bias`); usually every tile but those at padding or at a
        document's edge."""
        rows = self.rows
        sequence = self.tile_group // self.n_blocks // self.kv_heads  # (T,) batch row
        block = self.tile_group % self.n_blocks  # (T,)
        clean = self.clean[sequence, block]  # (T,)
        if segment_ids is not None:
            row = self.row_query.view(-1, rows)  # (T, rows) query rows of (S'*L)
            query_doc = segment_ids.reshape(-1)[
                row // (self.heads * self.length) * self.length + row % self.length
            ]  # (T, rows)
            block_doc = segment_ids[sequence, block * self.block][:, None]  # (T, 1)
            same = (query_doc == block_doc) | self.unused.view(-1, rows)
            clean &= same.all(dim=1)
        order = torch.sort((~clean).to(torch.uint8), stable=True).indices  # (T,) clean first
        self.n_clean = int(clean.sum())
        self.tile_group = self.tile_group[order]
        self.row_query = self.row_query.view(-1, rows)[order].reshape(-1)
        self.unused = self.unused.view(-1, rows)[order].reshape(-1)
        if self.hidden is not None:
            self.hidden = self.hidden[order]

    # --- own block ---------------------------------------------------------------------------
    def _own(self, x: torch.Tensor) -> torch.Tensor:
        """Keys or values (B, H_kv, L, E) -> (B*H_kv*n, 1, b, E), zero-padded: blocks as the
        batch, so that the kernels' (batch, length, 1, E) results are these shapes without a
        copy."""
        blocks = to_blocks(x, self.block)  # (B, H_kv, n, b, E)
        return blocks.reshape(-1, 1, self.block, x.shape[-1])

    def _own_grouped(self, x: torch.Tensor) -> torch.Tensor:
        """One sequence's (H or H_kv, L, E) -> (n, H or H_kv, b, E), zero-padded: its blocks
        as the batch and the heads as the fused kernel's (grouped) heads, a strided view of
        `x` when L is a multiple of b (as `local.grouped_window_attention`)."""
        return to_blocks(x[None], self.block)[0].transpose(0, 1)

    def _own_clean(self) -> torch.Tensor:
        """(B*H_kv*n,) bool: the own blocks (`_own`'s order) that are whole (b positions
        before L) and clean, so that their rule alone (causal or none) is the masked one;
        `own_clean_blocks` (B, n) the same per batch row (`_own_grouped`'s order)."""
        whole = torch.arange(self.n_blocks, device=self.clean.device) < self.length // self.block
        self.own_clean_blocks = self.clean & whole  # (B, n)
        return self.own_clean_blocks[:, None].expand(-1, self.kv_heads, -1).reshape(-1)

    def _own_parts(self, dtype, device, sequence=None):
        """The own blocks' fused calls: (index into the blocks, or None for all, bias, causal
        flag) each; the blocks are `_own`'s B*H_kv*n (`sequence` None) or batch row
        `sequence`'s n (`_own_grouped`). Without masks one call; with them the clean blocks
        take the call without masks (`_own_clean`), the others the document bias."""
        if self.masks is None:
            copies = self.batch * self.kv_heads if sequence is None else 1
            return [(None, self._own_bias(dtype, device, copies), self.causal)]
        clean = self.own_clean if sequence is None else self.own_clean_blocks[sequence]
        n_clean = int(clean.sum())
        if n_clean == clean.numel():
            return [(None, None, self.causal)]
        if n_clean == 0:
            where = self._own_positions(None, sequence, device)
            return [(None, self._own_document_bias(dtype, device, *where), False)]
        dirty = (~clean).nonzero().squeeze(1)
        where = self._own_positions(dirty, sequence, device)
        return [
            (clean.nonzero().squeeze(1), None, self.causal),
            (dirty, self._own_document_bias(dtype, device, *where), False),
        ]

    def _own_positions(self, index, sequence, device):
        """The batch rows and blocks (N,) each of the own blocks `index` (None: all) of
        `_own_parts`' numbering."""
        if sequence is not None:
            blocks = torch.arange(self.n_blocks, device=device) if index is None else index
            return torch.full_like(blocks, sequence), blocks
        per_head = torch.arange(self.batch * self.kv_heads * self.n_blocks, device=device)
        per_head = per_head if index is None else per_head[index]  # (N,) b*H_kv*n + h*n + c
        return per_head // (self.kv_heads * self.n_blocks), per_head % self.n_blocks

    def _own_bias(self, dtype, device, copies):
        if self.causal or self.length % self.block == 0:
            return None  # causally a padded key comes after every real query
        pad = torch.arange(self.n_blocks * self.block, device=device) >= self.length
        hidden = pad.view(self.n_blocks, 1, self.block).expand(-1, self.block, -1)
        hidden = hidden.repeat(copies, 1, 1)[:, None]  # (copies*n, 1, b, b)
        return flash.hidden_bias(hidden, dtype)

    def _own_document_bias(self, dtype, device, rows, blocks):
        """The own blocks' bias under masks: hidden unless `document_mask` and the block's
        rule (causal: key <= query; else a real position) allow the pair, (N, 1, b, b) for
        the own blocks of batch rows `rows` and blocks `blocks` (N,)."""
        # The (batch row, block) pairs, each once for all heads: (P,) and (N,) into them.
        pairs, where = torch.unique(rows * self.n_blocks + blocks, return_inverse=True)
        start = (pairs % self.n_blocks * self.block)[:, None, None]  # (P, 1, 1)
        offset = torch.arange(self.block, device=device)
        query, key = start + offset[:, None], start + offset[None, :]  # (P, b, 1), (P, 1, b)
        rule = key <= query if self.causal else key < self.length  # (P, b, b)
        # Positions in the flattened masks (b L + i); the last block's positions past L read
        # the next sequence's, but `rule` hides them from every real query.
        batch = (pairs // self.n_blocks * self.length)[:, None, None]
        documents = document_mask(**self.masks, query=batch + query, key=batch + key)[0]
        hidden = ~(rule & documents)  # (P, b, b)
        return flash.hidden_bias(hidden[where][:, None], dtype)  # (N, 1, b, b)

    def _own_calls(self, fn, tensors, parts):
        """`fn` (`flash.attend` or `attend_backward`) over the own blocks `tensors` (each
        (B*H_kv*n, 1, b, E) or, of one batch row and KV head, (n, G or 1, b, E)), one call per
        part of `parts` (`_own_parts` of that numbering), the results in block order."""
        results = None
        for index, bias, causal in parts:
            if index is None:
                return fn(*tensors, scale=self.scale, bias=bias, causal=causal)
            picked = [x.index_select(0, index) for x in tensors]
            part = fn(*picked, scale=self.scale, bias=bias, causal=causal)
            if results is None:
                n = tensors[0].shape[0]
                results = [p.new_empty((n, *p.shape[1:])) for p in part]
            for result, p in zip(results, part, strict=True):
                result.index_copy_(0, index, p)
        return results

    def own_forward(self, q, k, v):
        if self.group > 1:
            return self._own_forward_grouped(q, k, v)
        out, lse = self._own_calls(
            flash.attend, [self._own(x) for x in (q, k, v)], self._own_parts(q.dtype, q.device)
        )  # (B*H*n, 1, b, D), (B*H*n, 1, b)
        shape = (self.batch, self.heads, self.n_blocks * self.block)
        out = out.reshape(*shape, self.head_dim)[:, :, : self.length]
        lse = lse.reshape(shape)[:, :, : self.length]
        return out.contiguous(), lse.contiguous()

    def own_backward(self, grad_out, q, k, v, out, lse):
        if self.group > 1:
            return self._own_backward_grouped(grad_out, q, k, v, out, lse)
        tensors = [self._own(x) for x in (grad_out, q, k, v, out)]
        tensors.append(self._own(lse.unsqueeze(-1)).squeeze(-1))
        grads = self._own_calls(
            flash.attend_backward, tensors, self._own_parts(q.dtype, q.device)
        )  # (B*H*n, 1, b, D) each
        shape = (self.batch, self.heads, self.n_blocks * self.block, self.head_dim)
        return [g.reshape(shape)[:, :, : self.length].contiguous() for g in grads]

    # Grouped KV heads: one (batch row, KV head) per call, its blocks the batch and its G
    # query heads the fused kernel's heads on one key head, as strided views (the blocks of a
    # KV head's G query heads are not one strided batch axis, so the flat layout would copy
    # q); a call's temporaries are G / H of the tensors'.
    def _own_heads(self):
        """(batch row, its own blocks' `_own_parts`, query heads, KV head) per call."""
        for s in range(self.batch):
            parts = self._own_parts(self.dtype, self.device, s)
            for h in range(self.kv_heads):
                yield s, parts, slice(h * self.group, (h + 1) * self.group), slice(h, h + 1)

    def _own_forward_grouped(self, q, k, v):
        padded = self.n_blocks * self.block
        out = q.new_empty(self.batch, self.heads, padded, self.head_dim)
        lse = None
        for s, parts, heads, kv in self._own_heads():
            tensors = [self._own_grouped(x[s, h]) for x, h in ((q, heads), (k, kv), (v, kv))]
            part_out, part_lse = self._own_calls(flash.attend, tensors, parts)  # (n, G, b, *)
            if lse is None:
                lse = part_lse.new_empty(self.batch, self.heads, padded)
            self._own_grouped(out[s, heads]).copy_(part_out)
            self._own_grouped(lse[s, heads, :, None]).squeeze(-1).copy_(part_lse)
        return out[:, :, : self.length].contiguous(), lse[:, :, : self.length].contiguous()

    def _own_backward_grouped(self, grad_out, q, k, v, out, lse):
        padded = self.n_blocks * self.block
        grads = [x.new_empty(x.shape[0], x.shape[1], padded, x.shape[3]) for x in (q, k, v)]
        for s, parts, heads, kv in self._own_heads():
            sides = ((grad_out, heads), (q, heads), (k, kv), (v, kv), (out, heads))
            tensors = [self._own_grouped(x[s, h]) for x, h in sides]
            tensors.append(self._own_grouped(lse[s, heads, :, None]).squeeze(-1).contiguous())
            parts_grads = self._own_calls(flash.attend_backward, tensors, parts)  # (n, *, b, D)
            for grad, h, part in zip(grads, (heads, kv, kv), parts_grads, strict=True):
                self._own_grouped(grad[s, h]).copy_(part)
        return [g[:, :, : self.length].contiguous() for g in grads]

    # --- selected blocks ---------------------------------------------------------------------
    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, E) -> (B*H*L, E): one row per query (a view when x is contiguous)."""
        return x.reshape(-1, x.shape[-1])

    def _flat_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H_kv, L, D) -> (B*H_kv*n, b, D), zero-padded: key blocks by group index."""
        return to_blocks(x, self.block).reshape(-1, self.block, self.head_dim)

    def _chunks(self):
        """Ranges [first, end) of at most `chunk` tiles, clean and masked tiles apart."""
        for start, stop in ((0, self.n_clean), (self.n_clean, self.n_tiles)):
            for first in range(start, stop, self.chunk):
                yield first, min(first + self.chunk, stop)

    def _row_buffer(self, rows: torch.Tensor) -> torch.Tensor:
        """One chunk's worth of gathered `_rows`, reused by every chunk: a fresh buffer per
        chunk costs its page faults again (as much as the gather)."""
        return rows.new_empty(self.chunk * self.rows, rows.shape[-1])

    def _tile_rows(self, rows: torch.Tensor, buffer: torch.Tensor, first: int, end: int):
        """Tiles [first, end) of `_rows`, gathered into `buffer`: (m, 1, TILE_ROWS, E)."""
        index = self.row_query[first * self.rows : end * self.rows]
        gathered = torch.index_select(rows, 0, index, out=buffer[: index.numel()])
        return gathered.view(end - first, 1, self.rows, -1)

    def _tile_keys(self, blocks: torch.Tensor, first: int, end: int) -> torch.Tensor:
        return blocks.index_select(0, self.tile_group[first:end]).unsqueeze(1)  # (m, 1, b, D)

    def _tile_bias(self, first: int, end: int, dtype):
        hidden = None if self.hidden is None else self.hidden[first:end, None, None, :]
        if self.masks is not None and first >= self.n_clean:
            documents = self._tile_hidden(first, end)  # (m, 1, rows, b)
            hidden = documents if hidden is None else documents | hidden.bool()
        if hidden is None:
            return None
        return flash.hidden_bias(hidden, dtype)  # (m, 1, 1 or rows, b)

    def _tile_hidden(self, first: int, end: int) -> torch.Tensor:
        """Tiles [first, end)'s pairs that `document_mask` hides (or past the last key):
        (m, 1, rows, b) bool. Positions are taken in the flattened masks, sequence b's
        position i at b L + i: a tile's queries and keys are of one sequence."""
        heads_and_length = self.heads * self.length
        row = self.row_query[first * self.rows : end * self.rows].view(-1, self.rows)
        query = row // heads_and_length * self.length + row % self.length  # (m, rows)
        group = self.tile_group[first:end]  # (m,) key block of sequence b * H_kv + h
        sequence_start = group // self.n_blocks // self.kv_heads * self.length  # (m,) b L
        key = group % self.n_blocks * self.block  # (m,) the block's first key
        key = key[:, None] + torch.arange(self.block, device=key.device)  # (m, b)
        beyond = key >= self.length  # the short last block's padding
        key = key.clamp(max=self.length - 1) + sequence_start[:, None]
        allowed = document_mask(**self.masks, query=query[:, :, None], key=key[:, None, :])[0]
        return (~allowed | beyond[:, None, :])[:, None]  # (m, 1, rows, b)

    def tiles_forward(self, q, k, v, out, lse):
        """The own-block result `out` (B, H, L, D) and `lse` (B, H, L) merged with every
        (query, selected block) part, chunk by chunk as the parts come out of the tiles:
        returns the merged output and logsumexp, same shapes (in `out` and `lse`'s memory
        when the output is float32 or wider: the caller's fresh tensors, no copy).

        Each query keeps a running sum of its parts' outputs weighted by exp(lse_part - ref),
        their sum of weights, and a reference `ref` (its own block's lse to start with), so no
        per-part output outlives its chunk. A part more than SHIFT_LIMIT above its query's
        ref first raises that ref to it (rescaling the sums): no weight exceeds
        exp(SHIFT_LIMIT), so nothing overflows, and the result is the logsumexp merge's.
        """
        acc_dtype = lse.dtype  # float32 for half types, as the kernels' logsumexp
        q_rows = self._rows(q)  # (S'*L, D)
        q_buffer = self._row_buffer(q_rows)
        k_blocks, v_blocks = self._flat_blocks(k), self._flat_blocks(v)
        acc = self._rows(out).to(acc_dtype)  # (S'*L, D): running state per query row
        ref = lse.reshape(-1)  # (S'*L,)
        norm = torch.ones_like(ref)
        for first, end in self._chunks():
            part_out, part_lse = flash.attend(
                self._tile_rows(q_rows, q_buffer, first, end),
                self._tile_keys(k_blocks, first, end),
                self._tile_keys(v_blocks, first, end),
                scale=self.scale,
                bias=self._tile_bias(first, end, q.dtype),
            )  # (m, 1, rows, D), (m, 1, rows)
            index = self.row_query[first * self.rows : end * self.rows]  # (m*rows,)
            # Unused rows (a copy of row 0) weigh exp(-inf) = 0.
            unused = self.unused[first * self.rows : end * self.rows]
            part_lse = part_lse.reshape(-1).masked_fill_(unused, float("-inf"))
            shift = part_lse - ref[index]
            if bool((shift > SHIFT_LIMIT).any()):
                _raise_ref(acc, norm, ref, index, part_lse)
                shift = part_lse - ref[index]
            weight = shift.exp_()  # (m*rows,)
            part_out = part_out.reshape(-1, self.head_dim).to(acc_dtype)
            acc.index_add_(0, index, part_out.mul_(weight[:, None]))
            norm.index_add_(0, index, weight)
        shape = (self.batch, self.heads, self.length)
        merged = acc.div_(norm[:, None]).to(out.dtype).view(*shape, self.head_dim)
        merged_lse = ref.add_(norm.log_()).view(shape)
        return merged, merged_lse

    def tiles_backward(self, grad_out, q, k, v, out, lse, grads):
        """Add every (query, selected block) part's gradients into `grads` (the own block's
        q, k, v gradients, fresh tensors of q's and k's shapes), in place."""
        d = self.head_dim
        q_rows, o_rows, g_rows = self._rows(q), self._rows(out), self._rows(grad_out)
        q_buffer, o_buffer, g_buffer = (self._row_buffer(r) for r in (q_rows, o_rows, g_rows))
        l_rows = lse.reshape(-1)  # (S'*L,)
        k_blocks, v_blocks = self._flat_blocks(k), self._flat_blocks(v)
        grad_q = self._rows(grads[0])  # (S'*L, D), in place
        grad_k, grad_v = self._block_grad(grads[1]), self._block_grad(grads[2])  # (G, b, D)
        for first, end in self._chunks():
            index = self.row_query[first * self.rows : end * self.rows]  # (m*rows,)
            unused = self.unused[first * self.rows : end * self.rows]
            # An unused row's gradient is 0, so its dq, and its share of dk and dv, are 0.
            grad_tile = self._tile_rows(g_rows, g_buffer, first, end)
            grad_tile.view(-1, d).masked_fill_(unused[:, None], 0)
            dq, dk, dv = flash.attend_backward(
                grad_tile,
                self._tile_rows(q_rows, q_buffer, first, end),
                self._tile_keys(k_blocks, first, end),
                self._tile_keys(v_blocks, first, end),
                self._tile_rows(o_rows, o_buffer, first, end),
                l_rows.index_select(0, index).view(end - first, 1, self.rows),
                scale=self.scale,
                bias=self._tile_bias(first, end, q.dtype),
            )  # (m, 1, rows, D), (m, 1, b, D) twice
            grad_q.index_add_(0, index, dq.reshape(-1, d))
            group = self.tile_group[first:end]
            grad_k.index_add_(0, group, dk.squeeze(1))
            grad_v.index_add_(0, group, dv.squeeze(1))
        if self.length % self.block:  # the padded blocks' gradients, back to (B, H, L, D)
            shape = (self.batch, self.kv_heads, -1, d)
            grads[1] += grad_k.view(shape)[:, :, : self.length]
            grads[2] += grad_v.view(shape)[:, :, : self.length]

    def _block_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """`grad` (B, H_kv, L, D) as key blocks (G, b, D): the tensor itself when L is a multiple
        of the block (gradients added in place), else zeros with the padding, added back by
        the caller."""
        if self.length % self.block == 0:
            return grad.view(-1, self.block, self.head_dim)
        return torch.zeros_like(self._flat_blocks(grad))


def _raise_ref(acc, norm, ref, index, part_lse) -> None:
    """Raise each query's reference `ref` to the largest of its parts' `part_lse` where that is
    higher, rescaling its running sums `acc` (rows, D) and `norm` (rows,) to match, in place.
    index: (r,) query row of each part, repeats allowed (a query's parts in one chunk)."""
    old = ref[index]  # (r,)
    ref.scatter_reduce_(0, index, part_lse, reduce="amax")
    new = ref[index]
    raised = new > old
    rows = index[raised]  # repeats write the same value
    factor = (old[raised] - new[raised]).exp_()
    acc[rows] = acc[rows] * factor[:, None]
    norm[rows] = norm[rows] * factor


def _clean_blocks(attention_mask, segment_ids, block: int) -> torch.Tensor:
    """(B, n) bool: the key blocks of `block` whose positions (before L) are all real and of
    one document (`segment_ids` non-decreasing: the first position's and the last's)."""
    some = attention_mask if attention_mask is not None else segment_ids
    length = some.shape[1]
    starts = torch.arange(0, length, block, device=some.device)  # (n,)
    last = (starts + block).clamp(max=length) - 1
    clean = torch.ones(some.shape[0], starts.numel(), dtype=torch.bool, device=some.device)
    if attention_mask is not None:
        padded = pad_to_multiple(~attention_mask[:, None], block).unflatten(2, (-1, block))
        clean &= ~padded.any(dim=3)[:, 0]
    if segment_ids is not None:
        clean &= segment_ids[:, starts] == segment_ids[:, last]
    return clean


def _flat(per_token: torch.Tensor | None) -> torch.Tensor | None:
    """(B, L) -> (1, B*L): one sequence of every sequence's positions, for `document_mask`
    (positions b L + i); None stays None."""
    return None if per_token is None else per_token.reshape(1, -1)
