"""Decoding caches: what each variant keeps between tokens, and the decode steps they share.

A variant that decodes (`Attention.supports_decode`) builds one of these in `init_cache` and
updates it in place in `prefill` (a prompt) and `decode` (one new position). Every cache knows
how many positions it has seen (`length`), the longest sequence it was built for (`max_len`)
and its live size in bytes (`nbytes`: the entries it holds now, not the buffers it reserved).
All are tensors of one batch size, heads and head_dim, on one device and dtype (`Cache.misfit`).
KVCache (every key and value), WindowCache (a ring of the last `window` positions and the older
ones a pattern needs), PrefixCache (summaries, then one open block), StateCache (a feature
attention's running sums), ClusterCache (a ring per cluster), BlockKVCache (every key and value
plus block summaries) and DeltaCache (a D x D state per head). A left-padded prompt: a cache of
positions keeps the pads' slots and each row's count (`pads`, read by `real_keys`); a state
cache (`holds_positions` False) takes each row's state from its real tokens alone (`put_row`).

What each keeps, and for which variants: docs/variants/common.md, "The decoding caches".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F

from variants.attention.common.kernelized import padded_denominator


class Cache:
    """What every cache has: `length` positions seen of at most `max_len`, `nbytes`, and what
    it was built for (`init_cache`): `batch` sequences of `heads` heads of `head_dim` (its
    keys' heads; `query_heads` the queries', more under grouped KV heads held as they are),
    inputs of `dtype` on `device`, which `misfit` checks a call against."""

    # False for a state with no position axis (running sums, a d x d matrix): module docstring.
    holds_positions: ClassVar[bool] = True

    def __init__(self, owner: str, batch, heads, head_dim, *, max_len: int, device, dtype):
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
            raise ValueError(f"{owner}: option 'max_len' must be a positive int, got {max_len!r}")
        self.owner = owner
        self.max_len = max_len
        self.length = 0
        self.batch, self.heads, self.head_dim = batch, heads, head_dim
        self.query_heads = heads  # `init_cache` sets n_heads where the cache holds n_kv_heads
        self.dtype = dtype or torch.get_default_dtype()
        self.device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", None -> default
        self.pads: torch.Tensor | None = None  # (B,) a left-padded prompt's pads per row

    def real_keys(self, positions: torch.Tensor) -> torch.Tensor | None:
        """(B, 1, 1, n) bool, True where held position `positions` (n,) is a real token of
        the row, not one of its prompt's left pads; None when no row was padded."""
        if self.pads is None:
            return None
        return (positions[None, :] >= self.pads[:, None])[:, None, None]

    @property
    def nbytes(self) -> int:
        """Bytes of the entries the cache holds now."""
        raise NotImplementedError

    def misfit(
        self, q: torch.Tensor, kv_heads: int, others: dict[str, torch.Tensor | None]
    ) -> str | None:
        """How q (B, H, T, D), keys of `kv_heads` heads as the hooks take them, and the `others`
        (k, v, gates by name) differ from what the cache holds, as "batch 1 but the cache
        holds batch 2 (init_cache batch_size)"; None if they fit."""
        wanted = [
            ("batch", q.shape[0], self.batch, "batch_size"),
            ("heads", q.shape[1], self.query_heads, "n_heads"),
            ("kv heads", kv_heads, self.heads, "n_kv_heads"),
            ("head_dim", q.shape[3], self.head_dim, "head_dim"),
        ]
        for label, t in {"q": q, **others}.items():
            if t is not None:
                named = "" if label == "q" else f" ({label})"
                wanted.append((f"dtype{named}", t.dtype, self.dtype, "dtype"))
                wanted.append((f"device{named}", t.device, self.device, "device"))
        for what, got, held, option in wanted:
            if got != held:
                return f"{what} {got} but the cache holds {what} {held} (init_cache {option})"
        return None

    def reserve(self, count: int) -> int:
        """Account for `count` new positions; returns the first one. `ValueError` past max_len."""
        first = self.length
        if first + count > self.max_len:
            raise ValueError(
                f"{self.owner}: cache of option 'max_len'={self.max_len} cannot take "
                f"{first + count} positions"
            )
        self.length += count
        return first


def _empty(shape, device, dtype) -> torch.Tensor:
    return torch.empty(shape, device=device, dtype=dtype)


class KVCache(Cache):
    """Keys and values of every position: (B, H, max_len, D) each, filled up to `length`."""

    def __init__(self, owner, batch, heads, head_dim, *, max_len, device=None, dtype=None):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        self.keys_buffer = _empty((batch, heads, max_len, head_dim), device, dtype)
        self.values_buffer = torch.empty_like(self.keys_buffer)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (B, H, T, D) for the next T positions, copied into the reserved buffers."""
        first = self.reserve(k.shape[2])
        self.keys_buffer[:, :, first : self.length] = k
        self.values_buffer[:, :, first : self.length] = v

    def keys(self) -> torch.Tensor:
        """(B, H, length, D) view."""
        return self.keys_buffer[:, :, : self.length]

    def values(self) -> torch.Tensor:
        """(B, H, length, D) view."""
        return self.values_buffer[:, :, : self.length]

    @property
    def nbytes(self) -> int:
        k = self.keys_buffer
        return 2 * k.shape[0] * k.shape[1] * self.length * k.shape[3] * k.element_size()


class WindowCache(Cache):
    """The last `window` positions in a ring, older positions that `keep` selects in a store.

    Ring slot p % window holds position p (`ring_positions`, -1 while empty). When a position
    leaves the ring and `keep(positions)` (bool per position) says a later query may still see
    it, it moves to the store, which is in position order and reserved for the `kept` positions
    below max_len. So every position seen is in the ring, the store or neither, never both.
    """

    def __init__(
        self,
        owner,
        batch,
        heads,
        head_dim,
        *,
        window: int,
        keep: Callable[[torch.Tensor], torch.Tensor] | None,
        kept: int,
        max_len,
        device=None,
        dtype=None,
    ):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        self.window = max(1, min(window, max_len))
        self.keep = keep
        shape = (batch, heads, self.window, head_dim)
        self.ring_keys, self.ring_values = (
            _empty(shape, device, dtype),
            _empty(shape, device, dtype),
        )
        self.ring_positions = torch.full((self.window,), -1, dtype=torch.long, device=device)
        store = (batch, heads, kept, head_dim)
        self.store_keys, self.store_values = (
            _empty(store, device, dtype),
            _empty(store, device, dtype),
        )
        self.store_positions = torch.empty(kept, dtype=torch.long, device=device)
        self.stored = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (B, H, T, D) for the next T positions."""
        count = k.shape[2]
        first = self.reserve(count)
        positions = torch.arange(first, first + count, device=self.ring_positions.device)
        # Positions that leave the ring: the ones it held that the new ones overwrite, and new
        # ones that never fit (a prompt longer than the window).
        leaving_old = self.ring_positions[self.ring_positions >= 0]
        leaving_old = leaving_old[leaving_old < self.length - self.window].sort().values
        if len(leaving_old):
            slots = leaving_old % self.window
            self._store(leaving_old, self.ring_keys[:, :, slots], self.ring_values[:, :, slots])
        overflow = max(0, count - self.window)
        if overflow:
            self._store(positions[:overflow], k[:, :, :overflow], v[:, :, :overflow])
        slots = positions[overflow:] % self.window
        self.ring_keys[:, :, slots] = k[:, :, overflow:]
        self.ring_values[:, :, slots] = v[:, :, overflow:]
        self.ring_positions[slots] = positions[overflow:]

    def _store(self, positions, keys, values) -> None:
        if self.keep is None:
            return
        chosen = self.keep(positions)  # (n,) bool
        positions, keys, values = positions[chosen], keys[:, :, chosen], values[:, :, chosen]
        end = self.stored + len(positions)
        self.store_keys[:, :, self.stored : end] = keys
        self.store_values[:, :, self.stored : end] = values
        self.store_positions[self.stored : end] = positions
        self.stored = end

    def gather(
        self, allows: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The held keys and values a query may see, by `allows(positions) -> bool`:
        (B, H, n, D) twice and their positions (n,), store first then ring (any order is
        fine: softmax attention does not care)."""
        ring = (self.ring_positions >= 0) & allows(self.ring_positions.clamp_min(0))
        ring = ring.nonzero().squeeze(-1)  # (r,)
        stored_positions = self.store_positions[: self.stored]
        store = allows(stored_positions).nonzero().squeeze(-1)  # (s,)
        keys = torch.cat([self.store_keys.index_select(2, store), self.ring_keys[:, :, ring]], 2)
        values = torch.cat(
            [self.store_values.index_select(2, store), self.ring_values[:, :, ring]], 2
        )
        positions = torch.cat([stored_positions[store], self.ring_positions[ring]])
        return keys, values, positions

    @property
    def nbytes(self) -> int:
        k = self.ring_keys
        held = int((self.ring_positions >= 0).sum()) + self.stored
        return 2 * k.shape[0] * k.shape[1] * held * k.shape[3] * k.element_size()


class PrefixCache(Cache):
    """A prefix of `summaries` entries, then the raw keys of the open block of `block` positions,
    in one buffer (B, H, max_summaries + block, D) each for keys and values: what a query sees
    is always the contiguous prefix [0, summaries + open)."""

    def __init__(self, owner, batch, heads, head_dim, *, block, max_len, device=None, dtype=None):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        self.block = block
        shape = (batch, heads, -(-max_len // block) + block, head_dim)
        self.keys_buffer, self.values_buffer = (
            _empty(shape, device, dtype),
            _empty(shape, device, dtype),
        )
        self.summaries = 0  # finished blocks
        self.open = 0  # raw positions of the open block

    def visible(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, summaries + open, D) views of keys and values."""
        end = self.summaries + self.open
        return self.keys_buffer[:, :, :end], self.values_buffer[:, :, :end]

    def open_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The open block's raw keys and values, (B, H, open, D) views."""
        rows = slice(self.summaries, self.summaries + self.open)
        return self.keys_buffer[:, :, rows], self.values_buffer[:, :, rows]

    @property
    def nbytes(self) -> int:
        k = self.keys_buffer
        held = self.summaries + self.open
        return 2 * k.shape[0] * k.shape[1] * held * k.shape[3] * k.element_size()


class StateCache(Cache):
    """Running sums of a feature attention: `state` (B, H, E, D + 1) = sum_j phi(k_j) [v_j, 1]^T
    over the positions seen, in float32 or wider (as `kernelized.causal_product` sums). With
    `shift` (B, H, 1, 1) (performer's largest key exponent so far; None for linear) the sums are
    held times exp(-shift), so that exponentials of large exponents stay in range."""

    holds_positions = False

    def __init__(
        self, owner, batch, heads, features, head_dim, *, max_len, device=None, dtype=None
    ):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        work = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.state = torch.zeros(batch, heads, features, head_dim + 1, device=device, dtype=work)
        self.shift: torch.Tensor | None = None

    def add(self, phi_k: torch.Tensor, v: torch.Tensor, shift: torch.Tensor | None = None) -> None:
        """phi_k: (B, H, T, E), v: (B, H, T, D): add the T positions to the sums. `shift`: the
        new constant, at least the held one, that phi_k is relative to (the held sums are
        rescaled to it)."""
        self.reserve(phi_k.shape[2])
        if shift is not None:
            if self.shift is not None:
                self.state *= (self.shift - shift).exp()
            self.shift = shift
        values = F.pad(v.to(self.state.dtype), (0, 1), value=1.0)  # (B, H, T, D+1)
        self.state += phi_k.to(self.state.dtype).transpose(-1, -2) @ values

    def put_row(self, row: int, other: StateCache) -> None:
        """Row `row`'s sums (and shift) become those of `other`, a cache of one row."""
        self.state[row] = other.state[0]
        if other.shift is not None:
            if self.shift is None:
                self.shift = other.shift.new_zeros(self.batch, *other.shift.shape[1:])
            self.shift[row] = other.shift[0]

    def read(self, phi_q: torch.Tensor, denominator_eps=0.0) -> torch.Tensor:
        """phi_q: (B, H_q, T, E) -> out (B, H_q, T, D): numerator over denominator (padded by
        `denominator_eps` and clamped at the smallest normal number, as `kernelized`). H_q a
        multiple of the cache's heads: grouped KV heads, query head h reads state h // G."""
        phi_q = phi_q.to(self.state.dtype)
        batch, heads, steps, _ = phi_q.shape
        rows = phi_q.reshape(batch, self.state.shape[1], -1, phi_q.shape[-1])  # (B, H, G*T, E)
        numerator = (rows @ self.state).view(batch, heads, steps, -1)  # (B, H_q, T, D+1)
        out, denominator = numerator[..., :-1], numerator[..., -1:]
        return out / padded_denominator(denominator, phi_q, denominator_eps)

    @property
    def nbytes(self) -> int:
        return self.state.numel() * self.state.element_size()


class ClusterCache(Cache):
    """Each cluster's `slots` most recent members: unit keys and values (B, H, K, slots, D), the
    member count of every cluster (B, H, K) (slot = count % slots for the next member)."""

    def __init__(
        self, owner, batch, heads, head_dim, *, clusters, slots, max_len, device=None, dtype=None
    ):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        self.slots = slots
        shape = (batch, heads, clusters, slots, head_dim)
        # Zeros, not empty: a query reads its cluster's every slot (unfilled ones masked), and
        # masked garbage (NaN) would still reach the output through 0 * NaN.
        self.keys_buffer = torch.zeros(shape, device=device, dtype=dtype)
        self.values_buffer = torch.zeros(shape, device=device, dtype=dtype)
        self.counts = torch.zeros(batch, heads, clusters, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        k = self.keys_buffer
        held = self.counts.clamp(max=self.slots).sum()
        return int(2 * held * k.shape[-1] * k.element_size())


class BlockKVCache(KVCache):
    """Every key and value (as `KVCache`) and the summaries of the `blocks` finished blocks of
    `block` positions: `summary_keys` (B, H, max_len // block, D) and, with
    `summarise_values`, `summary_values` of the same shape, filled up to `blocks`. The open
    block has no summary: no query scores or attends to a block before it has ended (MoBA's
    candidates end before the query's own block; NSA's compressed branch sees ended blocks)."""

    def __init__(
        self,
        owner,
        batch,
        heads,
        head_dim,
        *,
        block: int,
        summarise_values: bool,
        max_len,
        device=None,
        dtype=None,
    ):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        self.block = block
        shape = (batch, heads, max_len // block, head_dim)
        self.summary_keys = _empty(shape, device, dtype)
        self.summary_values = _empty(shape, device, dtype) if summarise_values else None
        self.blocks = 0

    def add_summaries(self, keys: torch.Tensor, values: torch.Tensor | None = None) -> None:
        """keys (and values): (B, H, n, D), the summaries of the next n finished blocks."""
        end = self.blocks + keys.shape[2]
        self.summary_keys[:, :, self.blocks : end] = keys
        if self.summary_values is not None:
            self.summary_values[:, :, self.blocks : end] = values
        self.blocks = end

    def summaries(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, H, blocks, D) views of the key summaries and the value summaries (or None)."""
        values = self.summary_values
        return (
            self.summary_keys[:, :, : self.blocks],
            None if values is None else values[:, :, : self.blocks],
        )

    @property
    def nbytes(self) -> int:
        k = self.summary_keys
        tables = 1 if self.summary_values is None else 2
        held = tables * k.shape[0] * k.shape[1] * self.blocks * k.shape[3] * k.element_size()
        return super().nbytes + held


class DeltaCache(Cache):
    """The delta rule's state as M = S^T (so that o = q M): (B, H, D, D), zero before the first
    position, in float32 or wider (as the chunked forward computes)."""

    holds_positions = False

    def __init__(self, owner, batch, heads, head_dim, *, max_len, device=None, dtype=None):
        super().__init__(owner, batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype)
        work = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
        self.state = torch.zeros(batch, heads, head_dim, head_dim, device=device, dtype=work)
        # With a short convolution: the last w - 1 positions' q, k, v (B, H, w - 1, 3D).
        self.conv_tail: torch.Tensor | None = None

    def put_row(self, row: int, other: DeltaCache) -> None:
        """Row `row`'s state (and convolution tail) become those of `other`, of one row."""
        self.state[row] = other.state[0]
        if other.conv_tail is not None:
            if self.conv_tail is None:
                self.conv_tail = other.conv_tail.new_zeros(self.batch, *other.conv_tail.shape[1:])
            self.conv_tail[row] = other.conv_tail[0]

    @property
    def nbytes(self) -> int:
        tail = (
            0 if self.conv_tail is None else self.conv_tail.numel() * self.conv_tail.element_size()
        )
        return self.state.numel() * self.state.element_size() + tail


def attend_prefix(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale=None, mask=None
) -> torch.Tensor:
    """Softmax attention of new queries over held keys: q (B, H, T, D), keys and values
    (B, H_kv, n, D) with H_kv dividing H (views are fine: the fused CPU kernel reads them in
    place) -> (B, H, T, D). n = 0 gives zeros (a softmax over nothing, as `combined` takes
    it). `mask`: None or (B, 1, 1, n) bool, True where a key is read (`Cache.real_keys`)."""
    if keys.shape[2] == 0:
        return torch.zeros_like(q)
    gqa = {"enable_gqa": True} if keys.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, **gqa)


def attend_allowed(
    q: torch.Tensor,
    cache: WindowCache,
    allows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    exclude_self: bool = False,
) -> torch.Tensor:
    """The newest position's query over the held keys its pattern allows: q (B, H, 1, D) ->
    (B, H, 1, D). `allows(query, keys)` is a pattern predicate on positions; `exclude_self`
    applies the shared-QK rule (its own key only when it is the only one)."""
    query = torch.tensor(cache.length - 1, device=cache.ring_positions.device)
    keys, values, positions = cache.gather(lambda held: allows(query, held))
    if exclude_self and len(positions) > 1:
        other = (positions != query).nonzero().squeeze(-1)
        keys, values = keys[:, :, other], values[:, :, other]
    return attend_prefix(q, keys, values)
