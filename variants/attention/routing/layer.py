"""Routing attention (Roy et al. 2020): a learnable pattern, tokens routed by online k-means.
The layer (`RoutingAttention`, the registry's entry, with its centroids); beside it
`cluster_windows` (the sort by cluster and each chunk's window of keys) and `function`
(`ClusterWindowAttention`, the autograd function that attends over those windows).

A token's routing vector is its query layer-normalised without scale (shared QK); it goes to the
nearest (by dot product) of `n_clusters` per-head centroids and attends to the `window` most
recent members of its cluster up to itself (non-causal: the members fewer than `window` places
away), with unit keys and the shared-QK self rule. No later token changes which keys an earlier
query gets. Centroids are seeded random vectors moved by a VQ-VAE-style EMA (`decay`) in
training forwards only; `last_clusters` is replayed inside `base.replaying()`. Time O(L K d) to
route, O(L m d) to attend. Masks: no query attends across a document or to a padded key.

The rule, causality, centroids, layout and masks in full: docs/variants/routing.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from variants.attention.common import buffers
from variants.attention.common.base import Attention, is_replaying, masked_attend, norm_floor
from variants.attention.common.buffers import index_dtype
from variants.attention.common.cache import ClusterCache
from variants.attention.common.masking import SequenceDocuments
from variants.attention.routing.cluster_windows import ClusterLayout, WindowDocuments
from variants.attention.routing.function import ClusterWindowAttention
from variants.checks import require_non_negative_int, require_positive_int, require_probability
from variants.registry import register_attention

# Counts below this are treated as this when dividing sums by counts (a cluster that has had
# no member for many steps decays to it instead of to 0 / 0).
COUNT_EPS = 1e-5


@register_attention
class RoutingAttention(Attention):
    """Routing Transformer: shared-QK tokens routed to k-means centroids, windows per cluster.

    The `k` argument is ignored: keys are the unit-normalised queries (the model passes q = k
    because this variant declares `shared_qk_required`). Centroid state lives in the buffers
    `centroid_sums` (H, K, D) and `centroid_counts` (H, K).
    """

    family = "learnable"
    small_options = {"n_clusters": 4, "window": 16}
    knobs = ("window", "n_clusters")

    name = "routing"
    exact = False
    time_complexity = "O(L w d + L K d)"
    memory_complexity = "O(L w)"
    softmax_kernels = "flash"
    shared_qk_required = True
    supports_gqa = False
    gqa_reason = "its keys are the unit-normalised queries (shared QK), one per query head"
    supports_decode = True
    supports_padding_mask = supports_segments = True  # masked inside the windows

    def __init__(
        self,
        *,
        causal: bool = False,
        n_clusters: int = 16,
        window: int = 128,
        decay: float = 0.999,
        seed: int | None = None,
        n_heads: int = 4,
        head_dim: int = 64,
    ):
        super().__init__(causal=causal)
        self.n_clusters = require_positive_int(self.name, "n_clusters", n_clusters)
        self.window = require_positive_int(self.name, "window", window)
        self.decay = require_probability(self.name, "decay", decay)
        self.seed = None if seed is None else require_non_negative_int(self.name, "seed", seed)
        self.n_heads = require_positive_int(self.name, "n_heads", n_heads)
        self.head_dim = require_positive_int(self.name, "head_dim", head_dim)
        generator = torch.Generator()
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ())))
        init = torch.randn(n_heads, n_clusters, head_dim, generator=generator)
        init = F.normalize(init, dim=-1) * math.sqrt(head_dim)  # (H, K, D)
        self.register_buffer("centroid_sums", init)
        self.register_buffer("centroid_counts", torch.ones(n_heads, n_clusters))
        self.last_clusters: torch.Tensor | None = None

    @property
    def centroids(self) -> torch.Tensor:
        """(H, K, D): running sums over running counts."""
        return self.centroid_sums / self.centroid_counts.clamp_min(COUNT_EPS).unsqueeze(-1)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, v: (B, H, L, D) -> (B, H, L, D); masks (B, L) as `Attention.forward` takes them
        (docs/variants/routing.md, "Masks": masked inside the windows, padded tokens in the
        padding cluster)."""
        batch, heads, length, head_dim = q.shape
        if (heads, head_dim) != (self.n_heads, self.head_dim):
            raise ValueError(
                f"{self.name}: options 'n_heads'={self.n_heads} and 'head_dim'={self.head_dim} "
                f"must equal the inputs' heads and head_dim {heads}, {head_dim} "
                f"(the centroids are per head)"
            )
        clusters = self._clusters(q, attention_mask)  # (B, H, L) int64
        m = min(self.window, length)
        padded = -(-length // m) * m
        layout = ClusterLayout(clusters, self.n_clusters, padded, self.window, self.causal)
        documents = None
        # Padding alone needs no window mask: the padding cluster keeps every real query off
        # padded keys (a padded query's row, zeroed afterwards, may see padded tokens).
        if segment_ids is not None:
            masks = SequenceDocuments(attention_mask, segment_ids, heads)
            windows = 2 if self.causal else 3
            documents = WindowDocuments(masks, layout.order_rows, padded, m, windows)
        q = F.pad(q, (0, 0, 0, padded - length)).flatten(0, 1)  # (S, Lp, D), S = B*H
        v = F.pad(v, (0, 0, 0, padded - length)).flatten(0, 1)  # (S, Lp, D)
        out = ClusterWindowAttention.apply(
            q,
            v,
            layout.order_rows,
            layout.slot_rows,
            layout.low,
            layout.high,
            m,
            self.causal,
            documents,
        )  # (S, Lp, D)
        return out.view(batch, heads, padded, head_dim)[:, :, :length]  # (B, H, L, D)

    def _clusters(
        self, q: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Each position's cluster, (B, H, L) int64; cached for replays, EMA-updated in training.

        The nearest centroid by dot product to the query layer-normalised without scale; where
        attention_mask (B, L) is False, n_clusters (the padding cluster), kept out of the
        centroids' update.
        """
        cached = self.last_clusters
        if is_replaying() and cached is not None and cached.shape == q.shape[:3]:
            return cached.long()
        with torch.no_grad():
            x = q.detach()
            if x.dtype in (torch.float16, torch.bfloat16):
                x = x.float()
            x = F.layer_norm(x, (x.shape[-1],))  # (B, H, L, D), norm sqrt(D)
            centroids = self.centroids.to(x.dtype).transpose(-1, -2)  # (H, D, K)
            clusters = torch.empty(x.shape[:3], dtype=torch.long, device=x.device)  # (B, H, L)
            rows = max(1, buffers.PIECE_BYTES // (x.shape[0] * x.shape[1] * self.n_clusters * 4))
            for start in range(0, x.shape[2], rows):
                scores = x[:, :, start : start + rows] @ centroids  # (B, H, l, K)
                clusters[:, :, start : start + rows] = scores.argmax(dim=-1)
            if self.training and not is_replaying():
                self._update_centroids(x, clusters, attention_mask)
            if attention_mask is not None:
                clusters.masked_fill_(~attention_mask[:, None], self.n_clusters)
        self.last_clusters = clusters.to(index_dtype(self.n_clusters + 1))
        return clusters

    # --- decoding: each cluster's window - 1 most recent members; centroids fixed (eval) ----
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return ClusterCache(
            self.name, batch_size, n_heads, head_dim, clusters=self.n_clusters,
            slots=self.window - 1, max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: ClusterCache) -> None:
        """Each cluster's last window - 1 members of the prompt, at slot rank % (window - 1)
        (rank: its place among the cluster's members), as decoding them one by one leaves."""
        batch, heads, length, head_dim = q.shape
        cache.reserve(length)
        clusters = self._clusters(q)  # (B, H, T); eval: no centroid update
        members = torch.zeros_like(cache.counts).scatter_add_(
            -1, clusters, torch.ones_like(clusters)
        )  # (B, H, K)
        cache.counts += members
        if cache.slots == 0:
            return
        positions = torch.arange(length, device=q.device)
        order = (clusters * length + positions).argsort(dim=-1)  # (B, H, T) by cluster, position
        sorted_clusters = clusters.gather(-1, order)  # (B, H, T)
        starts = (members.cumsum(-1) - members).gather(-1, sorted_clusters)  # (B, H, T)
        rank = positions - starts  # place of each sorted member within its cluster
        kept = rank >= members.gather(-1, sorted_clusters) - cache.slots  # (B, H, T)
        sequence = torch.arange(batch * heads, device=q.device).view(batch, heads, 1)
        target = (sequence * self.n_clusters + sorted_clusters) * cache.slots + rank % cache.slots
        source = sequence * length + order  # rows of the flattened (B*H*T, D) inputs
        target, source = target[kept], source[kept]
        unit = q / q.norm(dim=-1, keepdim=True).clamp_min(norm_floor(q.dtype))
        cache.keys_buffer.view(-1, head_dim)[target] = unit.reshape(-1, head_dim)[source]
        cache.values_buffer.view(-1, head_dim)[target] = v.reshape(-1, head_dim)[source]

    def decode_step(self, q, k, v, cache: ClusterCache) -> torch.Tensor:
        """Routes the query to its cluster, attends to that cluster's cached members (the
        window - 1 most recent before it; itself if there is none), then joins them."""
        batch, heads, _, head_dim = q.shape
        cache.reserve(1)
        cluster = self._clusters(q)[:, :, 0]  # (B, H)
        count = cache.counts.gather(-1, cluster[..., None])  # (B, H, 1)
        unit = q / q.norm(dim=-1, keepdim=True).clamp_min(norm_floor(q.dtype))  # (B, H, 1, D)
        out = v
        if cache.slots:
            index = cluster.view(batch, heads, 1, 1, 1).expand(-1, -1, 1, cache.slots, head_dim)
            keys = cache.keys_buffer.gather(2, index)[:, :, 0]  # (B, H, S, D)
            values = cache.values_buffer.gather(2, index)[:, :, 0]
            held = torch.arange(cache.slots, device=q.device) < count  # (B, H, S)
            attended, lse = masked_attend(q, keys, values, held[:, :, None], scale=1.0)
            out = torch.where(lse.isfinite()[..., None], attended, v)  # (B, H, 1, D)
            b, h = torch.meshgrid(
                torch.arange(batch, device=q.device),
                torch.arange(heads, device=q.device),
                indexing="ij",
            )
            slot = count[..., 0] % cache.slots  # (B, H)
            cache.keys_buffer[b, h, cluster, slot] = unit[:, :, 0]
            cache.values_buffer[b, h, cluster, slot] = v[:, :, 0]
        cache.counts.scatter_add_(-1, cluster[..., None], torch.ones_like(count))
        return out

    def _update_centroids(
        self, x: torch.Tensor, clusters: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> None:
        """One EMA step: counts and sums decay by `decay` and gain (1 - decay) times this
        forward's members, padded tokens (attention_mask (B, L) False) not counted.
        x: (B, H, L, D) routing vectors; clusters: (B, H, L)."""
        heads, n_clusters, head_dim = self.centroid_sums.shape
        head = torch.arange(heads, device=x.device).view(1, heads, 1)
        index = (head * n_clusters + clusters).flatten()  # (B*H*L,) into (H*K,)
        vectors = x.flatten(0, 2)  # (B*H*L, D)
        if attention_mask is not None:
            real = attention_mask[:, None].expand_as(clusters).flatten()  # (B*H*L,)
            index, vectors = index[real], vectors[real]
        counts = torch.bincount(index, minlength=heads * n_clusters)  # (H*K,)
        sums = x.new_zeros(heads * n_clusters, head_dim).index_add_(0, index, vectors)
        rate = 1.0 - self.decay
        self.centroid_counts.mul_(self.decay).add_(counts.view(heads, n_clusters), alpha=rate)
        sums = sums.view(heads, n_clusters, head_dim).to(self.centroid_sums.dtype)
        self.centroid_sums.mul_(self.decay).add_(sums, alpha=rate)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """Scores and values of the pairs a single cluster allows: the most any routing allows
        (more clusters leave their first members fewer keys), and exactly full attention's
        pairs at window >= seq_len. Routing, O(L K d) without gradient, is not counted."""
        length, window = seq_len, min(self.window, seq_len)
        if self.causal:
            pairs = window * (window + 1) // 2 + (length - window) * window
        else:
            pairs = length * length - (length - window) * (length - window + 1)
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, n_clusters={self.n_clusters}, window={self.window}, "
            f"decay={self.decay}, seed={self.seed}, n_heads={self.n_heads}, "
            f"head_dim={self.head_dim}"
        )
