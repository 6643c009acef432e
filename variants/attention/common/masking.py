"""Padding masks, document (segment) masks and grouped KV heads: the pieces kernels share.

The kernel contract (`Attention.forward`) takes two optional masks, both (B, L):
`attention_mask`, bool, **True = a real token (keep)** (the flash-attention / Hugging Face
convention), and `segment_ids`, integer document ids of packed sequences, non-decreasing along
L. Padded keys are never attended to, padded queries' outputs are zeros, and no query attends a
key of another document. Pattern variants fold both into `document_mask` (same document, and
the key real or the query itself, so no row is ever empty); state variants, compressed and
Linformer run each document as a sequence of its own (`per_document`). Left padding (prompts of
different lengths): each row's pads come first (`left_pads`). Grouped KV heads: query head h
reads key head h // (H / H_kv), as PyTorch's `enable_gqa`; kernels that cannot use the grouping
directly get repeated keys (`repeat_kv`).

The conventions and which variant takes which route: docs/variants/common.md, "Masks' conventions".
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, H_kv, L, D) -> (B, n_heads, L, D), head h a copy of head h // (n_heads / H_kv)."""
    batch, kv_heads, length, dim = x.shape
    if kv_heads == n_heads:
        return x
    group = n_heads // kv_heads
    return (
        x[:, :, None]
        .expand(batch, kv_heads, group, length, dim)
        .reshape(batch, n_heads, length, dim)
    )


def document_mask(
    attention_mask: torch.Tensor | None,
    segment_ids: torch.Tensor | None,
    query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """Bool (B, *pairs): True where the query at position `query` may attend the key at `key`
    as far as documents and padding go (same document; key real, or the query itself).

    attention_mask, segment_ids: (B, L) or None (not both). query, key: integer positions
    broadcastable against each other (e.g. (n, b, 1) and (n, 1, w)); positions outside [0, L)
    are read at the nearest position (the kernel's own mask removes them).
    """
    some = attention_mask if attention_mask is not None else segment_ids
    length = some.shape[1]
    shape = torch.broadcast_shapes(query.shape, key.shape)
    # Positions are read unbroadcast (e.g. (n, b, 1) and (n, 1, w), not twice (n, b, w)) and
    # broadcast only where compared: the reads were most of the mask's cost.
    q_at, k_at = (x.reshape((1,) * (len(shape) - x.dim()) + x.shape) for x in (query, key))
    q_at, k_at = q_at.clamp(0, length - 1), k_at.clamp(0, length - 1)
    allowed = torch.ones((some.shape[0], *shape), dtype=torch.bool, device=some.device)
    if segment_ids is not None:
        allowed &= _at(segment_ids, q_at) == _at(segment_ids, k_at)
    if attention_mask is not None:
        allowed &= _at(attention_mask, k_at) | (q_at == k_at)
    return allowed


def left_pads(owner: str, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Each row's count of leading pads (B,) int64 for a left-padded (B, T) bool mask, True =
    a real token; None without a mask or when no row is padded. `ValueError` naming `owner`
    unless every row is pads then at least one real token."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    if bool((attention_mask[:, :-1] & ~attention_mask[:, 1:]).any()) or not bool(
        attention_mask[:, -1].all()
    ):
        raise ValueError(
            f"{owner}: option 'attention_mask' must be left padding (each row False then True, "
            "at least one True) for a prompt"
        )
    return (~attention_mask).sum(dim=1)  # (B,)


def token_positions(
    attention_mask: torch.Tensor | None, segment_ids: torch.Tensor | None
) -> torch.Tensor | None:
    """Each token's position in its own sequence, (B, L) int64: the real tokens before it in
    its document (its row without `segment_ids`), so a left-padded row and a packed document
    count from 0 as when alone; None when neither mask is given. attention_mask (B, L) bool,
    True = real; segment_ids (B, L) ints, each document contiguous. Pads get a neighbour's."""
    given = attention_mask if attention_mask is not None else segment_ids
    if given is None:
        return None
    real = torch.ones_like(given, dtype=torch.long) if attention_mask is None else attention_mask
    real = real.long()
    count = real.cumsum(-1)  # (B, L) real tokens up to and including each
    if segment_ids is not None:
        starts = torch.ones_like(segment_ids, dtype=torch.bool)
        starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
        before = count - real  # real tokens strictly before: non-decreasing along a row
        count = count - torch.where(starts, before, 0).cummax(dim=-1).values  # the document's
    return (count - 1).clamp_min(0)


def real_prefix(attention_mask: torch.Tensor) -> int:
    """The batch's real prefix: 1 + the last position real in some sequence (at least 1), so
    every position from there on is padding in every sequence (a right-padded batch's tail
    common to all its rows). attention_mask: (B, L) bool, True = real."""
    real = attention_mask.any(dim=0).nonzero()  # (r, 1): positions real in some sequence
    return int(real[-1]) + 1 if real.numel() else 1


def on_real_prefix(
    attend: Callable[..., torch.Tensor], tensors: list[torch.Tensor], masks: dict
) -> torch.Tensor | None:
    """`attend(*tensors, **masks)` run on the batch's real prefix (`real_prefix`) alone, the
    padded tail common to every sequence given zero outputs (and so no gradient): None when
    there is no such tail. For kernels in which no real query reads a key, a summary or a
    routing score of that tail (MoBA, NSA), where the prefix alone is the same rule.
    tensors: (B, H, L, ...) each (q, k, v and any gates); masks: `attend`'s keywords, (B, L)."""
    keep = masks.get("attention_mask")
    length = tensors[0].shape[2]
    if keep is None or (real := real_prefix(keep)) >= length:
        return None
    prefix = {name: mask[:, :real] for name, mask in masks.items()}
    out = attend(*(x[:, :, :real] for x in tensors), **prefix)  # (B, H, real, D)
    return torch.nn.functional.pad(out, (0, 0, 0, length - real))  # (B, H, L, D)


def masking_masks(masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`masks` (`attend`'s keywords, attention_mask and segment_ids (B, L)) without those
    that hide no pair: a padding mask with every token real, segment ids of one document per
    sequence. What is left hides exactly the pairs `masks` did."""
    kept = {}
    keep, segments = masks.get("attention_mask"), masks.get("segment_ids")
    if keep is not None and not bool(keep.all()):
        kept["attention_mask"] = keep
    if segments is not None and not bool((segments == segments[:, :1]).all()):
        kept["segment_ids"] = segments
    return kept


class SequenceDocuments:
    """`document_mask` for kernels that reorder every sequence their own way (LSH's sorted
    rounds, routing's clusters): S = B * heads sequences, B*H flattened (sequence s is batch
    row s // heads), each with its own positions at each sorted slot.

    attention_mask, segment_ids: (B, L) or None (not both), as `document_mask` takes them.
    """

    def __init__(
        self, attention_mask: torch.Tensor | None, segment_ids: torch.Tensor | None, heads: int
    ):
        some = attention_mask if attention_mask is not None else segment_ids
        self.batch, self.length = some.shape
        self.heads = heads
        # One row of B*L tokens: position p of batch row b is token b*L + p. A query and its
        # keys are always of one sequence, so documents never need telling apart across rows.
        self.flat = [None if x is None else x.reshape(1, -1) for x in (attention_mask, segment_ids)]

    def allowed(self, sequences: slice, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Bool (s, *pairs) for the sequences `sequences` (a slice of range(S)): query, key
        integer positions (s, ...) broadcastable against each other (any integer dtype);
        positions outside [0, L) are read at the nearest position, as `document_mask`."""
        rows = torch.arange(self.batch * self.heads, device=query.device)[sequences]  # (s,)
        trailing = (1,) * (max(query.dim(), key.dim()) - 1)
        start = (rows // self.heads * self.length).view(-1, *trailing)  # (s, 1, ...)
        q_at = query.clamp(0, self.length - 1).long() + start  # (s, ...)
        k_at = key.clamp(0, self.length - 1).long() + start  # (s, ...)
        return document_mask(*self.flat, q_at, k_at)[0]


def _at(per_token: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """per_token (B, L) read at `positions` (any shape of indices): (B, *positions.shape)."""
    return per_token[:, positions.reshape(-1)].view(per_token.shape[0], *positions.shape)


def zero_padded_queries(out: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """out (B, H, L, D) with the rows of padded queries (mask False) set to 0; no gradient
    flows through them."""
    if attention_mask is None:
        return out
    return zero_padded_positions(out, attention_mask)


def zero_padded_positions(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, E) with the padded positions (mask False) set to 0; they pass no gradient."""
    return x.masked_fill(~attention_mask[:, None, :, None], 0.0)


def documents(
    attention_mask: torch.Tensor | None, segment_ids: torch.Tensor | None, batch: int, length: int
) -> list[list[torch.Tensor]]:
    """Per sequence, its documents' real positions: a list (B) of lists of (n,) int64 tensors,
    in position order, documents with no real token left out."""
    device = (attention_mask if attention_mask is not None else segment_ids).device
    positions = torch.arange(length, device=device)
    out = []
    for b in range(batch):
        if segment_ids is None:
            runs = [positions]
        else:
            _, counts = torch.unique_consecutive(segment_ids[b], return_counts=True)
            runs = list(positions.split(counts.tolist()))
        if attention_mask is not None:
            runs = [run[attention_mask[b, run]] for run in runs]
        out.append([run for run in runs if len(run)])
    return out


def per_document(
    fn: Callable[..., torch.Tensor],
    *inputs: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """`fn(*inputs)` on every document's real positions as a sequence of its own, the outputs
    put back at their positions; padded positions' outputs are 0.

    inputs: (B, H, L, *) each (q, k, v, gates; k, v with q's heads); fn maps the (1, H, n, *)
    slices to (1, H, n, D). A state kernel so restarts at every document boundary and never
    takes a padded key in. One call per document: the cost is a Python loop over documents.
    """
    batch, heads, length = inputs[0].shape[:3]
    rows = []
    for b, runs in enumerate(documents(attention_mask, segment_ids, batch, length)):
        shape = (heads, length, inputs[2].shape[-1])
        row = inputs[0].new_zeros(shape)  # (H, L, D)
        if runs:
            pieces = [fn(*(x[b : b + 1, :, run] for x in inputs))[0] for run in runs]
            row = row.index_copy(1, torch.cat(runs), torch.cat(pieces, dim=1))
        rows.append(row)
    return torch.stack(rows)  # (B, H, L, D)
