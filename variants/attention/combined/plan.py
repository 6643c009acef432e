"""How a combined pattern runs at one length: its disjoint pieces (`Plan`), built once per
length and device by `CombinedAttention.plan` and read by `function.CombinedPieces`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from variants import patterns
from variants.attention.common import flash


@dataclass(eq=False)
class Plan:
    """The pieces of one combined pattern at one length; all tensors on one device.

    Tiles: `tiles[c]` lists the key blocks query block c needs (K slots, position order,
    unused slots EMPTY), `kinds` their states and `hidden[c]` which of the gathered keys each
    of its queries may not see (EMPTY slots, padding, and the predicate's verdict inside
    PARTIAL slots; FULL slots are all visible): uint8, which converts to a float bias 4x as
    fast as bool (`flash.hidden_bias`), O(L K b) bytes.
    """

    seq_len: int
    block: int  # execution tile: block_size, or L when that is shorter
    tile_pattern: patterns.Pattern | None
    tiles: torch.Tensor  # (n, K) int64
    kinds: torch.Tensor  # (n, K) uint8
    hidden: torch.Tensor  # (n, b, K * b) uint8, 1 = hidden
    stride: int | None  # the strided piece's stride
    summary: patterns.Summary | None
    summary_keys: torch.Tensor | None  # (n_summary_keys,) int64 positions
    global_rows: int  # rows that see every key (non-causal global)
    causal: bool
    # The pairs of the tiles, strided and summary pieces (disjoint; in the global rows they are
    # computed, then replaced): for checks.
    pieces: dict[str, patterns.Pattern]

    @classmethod
    def build(
        cls,
        parts: dict[str, patterns.Pattern],
        seq_len: int,
        device,
        *,
        causal: bool,
        block_size: int,
        n_global: int,
        stride: int | None,
    ) -> Plan:
        """The plan of `parts` (the layer's `part_patterns`, before the causal cut) at
        `seq_len`; `stride` is the strided part's at this length (None without one)."""
        cut = (lambda p: p & patterns.Causal()) if causal else (lambda p: p)
        own_block = patterns.Local(block_size, 0, 0)
        pieces, excluded = {}, []
        if "strided" in parts:
            pieces["strided"] = cut(parts["strided"])
            excluded.append(parts["strided"])
        summary = parts.get("summary")
        if summary is not None:
            pieces["summary"] = cut(summary & ~own_block)
            excluded.append(summary & ~own_block)
        tile_parts = [parts[name] for name in ("local", "random") if name in parts]
        if "global" in parts:  # its key columns; its rows are a piece of their own
            tile_parts.append(patterns.Global(n_global, causal=True))
        if summary is not None:
            tile_parts.append(summary & own_block)
        tile_pattern = None
        if tile_parts:
            tile_pattern = cut(
                patterns.intersection([patterns.union(tile_parts), *(~p for p in excluded)])
            )
            pieces["tiles"] = tile_pattern
        # Without causality the first n_global queries see every key: their own piece (the
        # other pieces' results in those rows are replaced).
        global_rows = min(n_global, seq_len) if "global" in parts and not causal else 0
        block = min(block_size, seq_len)
        tiles, kinds, hidden = _tile_lists(tile_pattern, seq_len, block)
        summary_keys = None if summary is None else summary.positions(seq_len)
        plan = cls(
            seq_len=seq_len,
            block=block,
            tile_pattern=tile_pattern,
            tiles=tiles,
            kinds=kinds,
            hidden=hidden,
            stride=stride,
            summary=summary,
            summary_keys=summary_keys,
            global_rows=global_rows,
            causal=causal,
            pieces=pieces,
        )
        return plan.to(device)

    def to(self, device) -> Plan:
        for name in ("tiles", "kinds", "hidden", "summary_keys"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self

    @property
    def n_blocks(self) -> int:
        return self.tiles.shape[0]

    def tile_bias(self, first: int, end: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The additive bias of query blocks [first, end) against their gathered tiles:
        (1, m, b, K * b), 0 where allowed and `flash.masked_score` where not; None when every
        slot is FULL (no mask at all)."""
        if bool((self.kinds[first:end] == patterns.FULL).all()):
            return None
        return flash.hidden_bias(self.hidden[first:end], dtype)[None]

    def tile_positions(self, first: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions of query blocks [first, end) and of their gathered keys, (m, b, 1)
        and (m, 1, K * b): the pairs of `hidden[first:end]` (padding and EMPTY slots are
        hidden there already)."""
        offset = torch.arange(self.block, device=self.tiles.device)
        query = torch.arange(first, end, device=offset.device)[:, None] * self.block + offset
        key = self.tiles[first:end, :, None] * self.block + offset  # (m, K, b)
        return query[:, :, None], key.flatten(1)[:, None, :]

    def pairs(self) -> int:
        """Allowed pairs of the whole pattern, counted piece by piece (the pieces are
        disjoint): the tiles' visible keys per row, the strided and summary pieces in closed
        form, and L keys for each global row."""
        length, b = self.seq_len, self.block
        per_row = torch.zeros(self.n_blocks, b, dtype=torch.int64)  # (n, b)
        if self.tiles.shape[1]:
            per_row += (self.hidden == 0).sum(-1).cpu()  # FULL slots have nothing hidden
        per_row = per_row.flatten()[:length]  # (L,)
        position = torch.arange(length, dtype=torch.int64)
        if self.stride is not None:
            per_row += position // self.stride + 1
            if not self.causal:
                per_row += (length - 1 - position) // self.stride
        if self.summary is not None:
            block = self.summary.block_size
            n_keys = len(self.summary_keys)
            own_first = position // block * block
            before = self.summary.count_before(own_first)  # summary keys of earlier blocks
            if self.causal:
                per_row += before
            else:
                own_end = (own_first + block).clamp(max=length)
                per_row += n_keys - (self.summary.count_before(own_end) - before)
        per_row[: self.global_rows] = length
        return int(per_row.sum())


def _tile_lists(pattern: patterns.Pattern | None, seq_len: int, block: int):
    """The tile piece's block lists (see `Plan`): each query block's needed key blocks in
    position order, their states, and the keys hidden from each query: (n, K) int64, (n, K)
    uint8 and (n, b, K * b) uint8. The predicate is evaluated inside PARTIAL tiles only."""
    n_blocks = -(-seq_len // block)
    if pattern is None:
        empty = torch.zeros(n_blocks, 0, dtype=torch.int64)
        return empty, empty.to(torch.uint8), torch.zeros(n_blocks, block, 0, dtype=torch.uint8)
    states = pattern.tile_states(seq_len, block)  # (n, n)
    if seq_len % block:  # the last key block holds padding, which a mask must hide
        last = states[:, -1]
        last[last == patterns.FULL] = patterns.PARTIAL
    needed = states != patterns.EMPTY
    slots = max(1, int(needed.sum(1).max()))
    order = torch.sort((~needed).to(torch.uint8), dim=1, stable=True).indices  # needed first
    tiles = order[:, :slots].contiguous()  # (n, K)
    kinds = states.gather(1, tiles)  # (n, K); EMPTY in unused slots
    tiles[kinds == patterns.EMPTY] = 0  # any real block: its keys are all hidden
    hidden = (kinds == patterns.EMPTY).to(torch.uint8)[:, :, None, None]  # (n, K, 1, 1)
    hidden = hidden.expand(-1, -1, block, block).contiguous()  # (n, K, b, b)
    query_block, slot = (kinds == patterns.PARTIAL).nonzero(as_tuple=True)  # (P,) each
    offset = torch.arange(block)
    query = (query_block[:, None] * block + offset)[:, :, None]  # (P, b, 1)
    key = (tiles[query_block, slot][:, None] * block + offset)[:, None, :]  # (P, 1, b)
    last = seq_len - 1  # padded positions evaluated at a real one, then hidden
    allowed = pattern.allows(query.clamp(max=last), key.clamp(max=last)) & (key < seq_len)
    hidden[query_block, slot] = (~allowed).to(torch.uint8)
    hidden = hidden.transpose(1, 2).reshape(n_blocks, block, slots * block)  # (n, b, K*b)
    return tiles, kinds, hidden
