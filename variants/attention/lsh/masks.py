"""The window keys an LSH query must not see: later keys (causal), padding, keys outside its
document or padded (`masking.document_mask`, when the forward has masks), and with `dedup` the
pairs an earlier round already offers. uint8 masks (1 = hidden) laid out as
`bucket_windows.window_view` lays out the keys; whole when they fit MASK_BYTES, else built per
slice of sequences and round (`RoundMasks`) each time forward and backward need them.
"""

from __future__ import annotations

import torch

from variants.attention.common import buffers
from variants.attention.common.buffers import index_dtype
from variants.attention.common.masking import SequenceDocuments
from variants.attention.lsh.bucket_windows import window_keys

# Bytes of the whole uint8 window mask (B*H*n_hashes*L*2m) above which it is not held: each
# slice and round's part is rebuilt when forward and backward need it (`RoundMasks`), which
# costs time, so below it (2^17 tokens at 4 heads with the defaults; 64 MiB at 32K) the whole
# mask is built once and saved. At 2^20 tokens it would be 2 GiB.
MASK_BYTES = 256 * 2**20


def hidden_keys(
    order: torch.Tensor,
    slot: torch.Tensor,
    length: int,
    m: int,
    *,
    causal: bool,
    dedup: bool,
    documents: SequenceDocuments | None = None,
) -> torch.Tensor | RoundMasks | None:
    """Mask of the window keys each sorted query must not see (uint8, 1 = hidden), or None.

    order, slot: (S, R, Lp), S = B*H, as in `LSHAttention.attend`; m: the chunk length. Hides
    later keys (`causal`) or padded keys (positions >= `length`), the pairs `documents`
    (the forward's key padding mask and segment ids) does not allow, and with `dedup` pairs an
    earlier round already offers. Shape (S, R, C, m, W*m),
    or (S, R, C, 1, W*m) when only padding is hidden, laid out as `window_view`'s keys
    (previous chunk, then own). A whole (S, R, C, m, W*m) mask of more than MASK_BYTES is
    not built: a `RoundMasks` then builds each slice and round's part when it is needed.
    uint8 rather than bool, and int16 positions where they fit: on CPU, broadcast
    comparisons wrote uint8 4-6x as fast as bool (and int16 operands 2-3x as fast as
    int32), and `window_bias` turns uint8 into floats 4x as fast.
    """
    n_seq, rounds, padded = order.shape
    n_chunks = padded // m
    # With one or two chunks every window is the whole sequence in every round: every pair
    # counts n_hashes times, which cancels in the softmax and in the round weights.
    dedup = dedup and rounds > 1 and n_chunks > 2
    if not (causal or dedup) and documents is None:
        if length == padded:
            return None
        pos = order.view(n_seq, rounds, n_chunks, m).to(index_dtype(padded))  # (S,R,C,m)
        return window_keys(pos).ge(length).to(torch.uint8)  # (S, R, C, 1, W*m)
    window = 1 if n_chunks == 1 else 2
    masks = RoundMasks(order, slot, length, m, causal=causal, dedup=dedup, documents=documents)
    if n_seq * rounds * padded * window * m > MASK_BYTES:
        return masks  # rebuilt per slice and round, in forward and again in backward
    hidden = torch.empty(
        n_seq, rounds, n_chunks, m, window * m, dtype=torch.uint8, device=order.device
    )
    # A few sequences and one round at a time, into the mask itself: temporaries the size
    # of the whole mask came back as fresh pages on every call (comparisons into uint8 go
    # through a bool temporary), and faulting them in cost as much as the comparisons.
    per_group = max(1, buffers.PIECE_BYTES // hidden[0, 0].numel())
    for start in range(0, n_seq, per_group):
        group = slice(start, start + per_group)
        same = torch.empty_like(hidden[group, 0])  # (g, C, m, W*m)
        for r in range(rounds):
            masks.fill(hidden[group, r], group, r, same)
    return hidden


def round_mask(mask, part: slice, r: int) -> torch.Tensor | None:
    """Round r of the sequences `part` of a whole mask, or built by a `RoundMasks`."""
    if mask is None:
        return None
    if isinstance(mask, RoundMasks):
        return mask.round(part, r)
    return mask[part, r]


class RoundMasks:
    """The window keys a sorted query must not see, per slice of sequences and round.

    order, slot: (S, R, Lp) as in `LSHAttention.attend`; documents: the forward's masks, or
    None. `fill` writes one round of a group of sequences into a (g, C, m, W*m) uint8 mask;
    `round` builds one. `hidden_keys` fills its whole mask with `fill`; above MASK_BYTES the
    attention takes this object instead and builds each slice and round's part when it attends
    to it (twice per step: forward and backward), so only one slice-round of mask is live.
    """

    def __init__(
        self,
        order,
        slot,
        length: int,
        m: int,
        *,
        causal: bool,
        dedup: bool,
        documents: SequenceDocuments | None = None,
    ):
        n_seq, self.rounds, padded = order.shape
        self.order, self.length, self.m, self.padded = order, length, m, padded
        self.n_chunks = padded // m
        self.window = 1 if self.n_chunks == 1 else 2
        self.causal, self.dedup, self.documents = causal, dedup, documents
        # Positions compare against `length` and chunk indices against n_chunks: the dtypes
        # must hold those too (int16 wraps 32768 around to -32768 without an error).
        self.positions = order.to(index_dtype(padded + 1))  # (S, R, Lp)
        self.chunk_of = (slot // m).to(index_dtype(self.n_chunks + 1))  # (S, R, Lp) chunk

    def round(self, part: slice, r: int) -> torch.Tensor:
        """(s, C, m, W*m) uint8 mask of round r of sequences `part`."""
        n_seq = len(range(*part.indices(self.order.shape[0])))
        shape = (n_seq, self.n_chunks, self.m, self.window * self.m)
        mask = torch.empty(shape, dtype=torch.uint8, device=self.order.device)
        self.fill(mask, part, r, torch.empty_like(mask))
        return mask

    def fill(self, mask: torch.Tensor, group: slice, r: int, same: torch.Tensor) -> None:
        """Write round r of sequences `group` into `mask` (g, C, m, W*m); `same` is scratch of
        its shape."""
        n_chunks, m, order = self.n_chunks, self.m, self.order
        pos = self.positions[group, r].unflatten(-1, (n_chunks, m))  # (g, C, m)
        if self.causal:
            # Padded keys sit after every real query, so this also hides them.
            torch.gt(window_keys(pos), pos.unsqueeze(-1), out=mask)
        elif self.length < self.padded:
            torch.ge(window_keys(pos).expand_as(mask), self.length, out=mask)
        else:
            mask.zero_()
        if self.documents is not None:
            # The document predicate on the positions the window holds; the padded slots
            # (>= length) it reads at L - 1 are hidden above.
            allowed = self.documents.allowed(group, pos.unsqueeze(-1), window_keys(pos))
            mask |= allowed.logical_not_()  # (g, C, m, W*m)
        for earlier in range(r if self.dedup else 0):
            # Key j is in query i's window in round e iff chunk_e(i) is chunk_e(j) or the one
            # after it.
            chunk = self.chunk_of[group, earlier].gather(1, order[group, r])  # (g, Lp)
            chunk = chunk.unflatten(-1, (n_chunks, m))  # (g, C, m)
            query_chunk = chunk.unsqueeze(-1)  # (g, C, m, 1)
            mask |= torch.eq(window_keys(chunk), query_chunk, out=same)
            mask |= torch.eq(window_keys((chunk + 1) % n_chunks), query_chunk, out=same)
