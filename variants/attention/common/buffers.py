"""How LSH cuts its work so that every temporary stays small: slices of sequences, ranges of
chunks, and one reused score-bias buffer.

On CPU, memory blocks above glibc's mmap threshold (32 MiB at most) come back as fresh pages on
every call, and faulting them in cost as much as the attention itself; blocks of a few MiB are
reused from the heap. The budgets below keep LSH's temporaries at that size (the measurements:
benchmarks/README.md, "LSH works on one round..." and "LSH avoids fresh pages...").
"""

from __future__ import annotations

import math

import torch

# Bytes of the largest window temporary of one slice (`sequence_slices`): well under glibc's
# mmap threshold, and large enough that a slice still holds many sequences at short lengths.
SLICE_BYTES = 16 * 2**20
# Bytes of the key and value window gradients of one flash backward call (`chunk_pieces`): the
# CPU backward kernel zero-fills its gradient outputs, so those must not be fresh pages either.
# The same budget bounds the hash's projection blocks and the groups of sequences the masks are
# built for.
PIECE_BYTES = 4 * 2**20


def sequence_slices(x: torch.Tensor, m: int, n_chunks: int) -> list[slice]:
    """Slices of the S = B*H sequences of x (S, Lp, D) such that one round of a slice keeps
    every window temporary (score bias, key and value windows, W*max(m, D) elements per row)
    within SLICE_BYTES, and at least one sequence each. (The backward's window gradients are
    further split into ranges of chunks: `chunk_pieces`.)"""
    n_seq, padded, head_dim = x.shape
    window = 1 if n_chunks == 1 else 2
    bytes_per_sequence = padded * window * max(m, head_dim) * x.element_size()
    per_slice = max(1, SLICE_BYTES // bytes_per_sequence)
    return [slice(start, min(start + per_slice, n_seq)) for start in range(0, n_seq, per_slice)]


def chunk_pieces(query_shape, window: int, element_size: int) -> list[slice]:
    """Ranges of the chunks of queries (s, C, m, D) whose window gradients (s, c, window, D)
    stay within PIECE_BYTES (one chunk at least), for one flash backward call each."""
    n_seq, n_chunks, _, head_dim = query_shape
    per_piece = max(1, PIECE_BYTES // (n_seq * window * head_dim * element_size))
    return [slice(c, min(c + per_piece, n_chunks)) for c in range(0, n_chunks, per_piece)]


class ScratchBuffer:
    """One buffer reused for the score bias of every round and range of chunks, viewed at the
    shape each asks for and grown to the largest: a new bias, 16 MiB per 32K sequence, came
    back as fresh pages on every round, and faulting them in cost as much as writing it."""

    def __init__(self, like: torch.Tensor):
        self.like = like  # dtype and device
        self.data: torch.Tensor | None = None

    def view(self, shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        if self.data is None or self.data.numel() < numel:
            self.data = self.like.new_empty(numel)
        return self.data[:numel].view(shape)


def index_dtype(count: int) -> torch.dtype:
    """The narrowest integer type for indices 0 .. count - 1 (int16 or int32): the pairwise
    comparisons of positions and chunk indices run on it."""
    return torch.int16 if count - 1 <= torch.iinfo(torch.int16).max else torch.int32
