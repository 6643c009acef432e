"""LSH's angular hash: the bucket of every position in every round.

One hash of n_buckets as in the paper up to SINGLE_HASH_MAX_BUCKETS; beyond, the pair of two
independent hashes of about sqrt(n_buckets) buckets each (`hash_factors`). No gradient flows
through a hash.
"""

from __future__ import annotations

import math

import torch

from variants.attention.common import buffers

# Up to this many buckets the hash is one angular hash, as in the paper; beyond, see hash_factors.
SINGLE_HASH_MAX_BUCKETS = 128


def hash_factors(n_buckets: int) -> tuple[int, ...]:
    """Bucket counts of the angular hashes whose concatenation buckets the vectors.

    One hash of n_buckets up to SINGLE_HASH_MAX_BUCKETS. Beyond, two independent hashes of
    about sqrt(n_buckets) buckets each (both even, product >= n_buckets): projecting onto
    n_buckets/2 columns would cost O(L^2 d / m) with the default count, more than the attention.
    """
    if n_buckets <= SINGLE_HASH_MAX_BUCKETS:
        return (n_buckets,)
    root = math.isqrt(n_buckets)
    # An exact even x even factorisation not too far from the square root (powers of two have
    # one), else the nearest even factors whose product overshoots a little.
    for first in range(root - root % 2, root // 2, -2):
        if n_buckets % (2 * first) == 0:
            return (first, n_buckets // first)
    first = 2 * max(1, round(math.sqrt(n_buckets) / 2))
    return (first, 2 * -(-n_buckets // (2 * first)))


def angular_hash(
    x: torch.Tensor, rotations: torch.Tensor, factors: tuple[int, ...]
) -> torch.Tensor:
    """Angular LSH: per round and factor n_f, argmax([xR_f; -xR_f]); the factors' buckets
    combine in mixed radix, the first most significant.

    x: (B, H, L, D); rotations: (D, R, sum_f n_f / 2), the factors' columns side by side.
    Returns (B, H, R, L) int64 buckets in [0, prod_f n_f). The largest of [xR; -xR] is the
    entry of xR largest in absolute value, taken in the second half when negative, so [xR; -xR]
    is never built. All rounds project in one matmul (the columns per round are at most
    SINGLE_HASH_MAX_BUCKETS / 2 or about sqrt(n_buckets)), in blocks of rows whose projection
    stays within PIECE_BYTES (projecting one 32K sequence at once, 16 MiB, faulted in fresh
    pages on every call).
    """
    *lead, head_dim = x.shape
    rounds, columns = rotations.shape[1], rotations.shape[2]
    rows = x.reshape(-1, head_dim)  # (N, D), N = B*H*L
    buckets = torch.empty(rows.shape[0], rounds, dtype=torch.int64, device=x.device)  # (N, R)
    block = max(1, buffers.PIECE_BYTES // (rounds * columns * x.element_size()))
    projection = rotations.flatten(1)  # (D, R * columns)
    with torch.no_grad():
        for start in range(0, rows.shape[0], block):
            projected = rows[start : start + block] @ projection  # (n, R * columns)
            projected = projected.view(-1, rounds, columns)  # (n, R, columns)
            parts = projected.split([n // 2 for n in factors], dim=-1)  # (n, R, n_f / 2) each
            bucket = None
            for part, n in zip(parts, factors, strict=True):
                index = part.abs().argmax(dim=-1, keepdim=True)  # (n, R, 1)
                negative = part.gather(-1, index) < 0  # (n, R, 1)
                factor_bucket = index.squeeze(-1) + negative.squeeze(-1) * (n // 2)  # (n, R)
                bucket = factor_bucket if bucket is None else bucket.mul_(n).add_(factor_bucket)
            buckets[start : start + block] = bucket
    return buckets.view(*lead, rounds).transpose(-1, -2).contiguous()  # (B, H, R, L)
