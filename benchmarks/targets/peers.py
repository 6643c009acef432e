"""The public implementations the kernel timings compare with, each as an attend(q, k, v).

With the optional extra `compare` installed (`pip install -e '.[compare]'`), the public
implementations are timed in the same rounds at the same settings, causal: reformer-pytorch's
`LSHAttention` (n_hashes 4, bucket_size 64; target "lsh >= 3x faster" at 32K),
routing-transformer's `KmeansAttention` (window 128, L / 128 clusters, shared QK) and
performer-pytorch's `FastAttention` (266 features; targets "routing and performer faster" at
16K). Each builder returns None when its package is not installed.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.targets.kernels import ROUTING_WINDOW, SETTINGS, shape
from variants import build_attention

REFORMER_PYTORCH = "reformer-pytorch"
ROUTING_TRANSFORMER = "routing-transformer"
PERFORMER_PYTORCH = "performer-pytorch"


def reformer_pytorch_lsh(length: int) -> Callable | None:
    """reformer-pytorch's LSHAttention at the `lsh` SETTINGS, causal, as an
    attend(q, k, v) on (B, H, L, D); None when the package is not installed. It takes shared
    qk and folds heads into the batch; its other options stay at its defaults (and do not
    depend on the length)."""
    try:
        from reformer_pytorch import LSHAttention
    except ImportError:
        return None
    module = LSHAttention(**SETTINGS["lsh"], causal=True).to(shape().device)

    def attend(q, k, v):
        batch, heads, length, head_dim = q.shape
        out, _, _ = module(q.flatten(0, 1), v.flatten(0, 1))  # (B*H, L, D)
        return out.view(batch, heads, length, head_dim)

    return attend


def routing_transformer_kmeans(length: int) -> Callable | None:
    """routing-transformer's KmeansAttention, causal, shared QK (keys are the queries, as our
    `routing`), window 128 and length / 128 clusters (its layout needs clusters x window = L),
    in training mode (it updates its centroids as ours does); None when not installed."""
    try:
        from routing_transformer.routing_transformer import KmeansAttention
    except ImportError:
        return None
    clusters = max(1, length // ROUTING_WINDOW)
    at = shape()
    module = KmeansAttention(
        clusters, ROUTING_WINDOW, at.heads, at.head_dim, causal=True, shared_qk=True
    ).to(at.device)

    def attend(q, k, v):
        out, _ = module(q, q, v)  # (B, H, L, D) and its commitment loss
        return out

    return attend


def performer_pytorch_favor(length: int) -> Callable | None:
    """performer-pytorch's FastAttention (FAVOR+ softmax kernel), causal, with our default
    number of features; None when not installed. Without its CUDA extension its causal path
    is its own chunked cumulative sum (and it says so when built)."""
    try:
        from performer_pytorch import FastAttention
    except ImportError:
        return None
    features = build_attention("performer").n_features
    return FastAttention(shape().head_dim, nb_features=features, causal=True).to(shape().device)


# Public implementation -> (our variant it is compared with, its builder).
PEERS = {
    REFORMER_PYTORCH: ("lsh", reformer_pytorch_lsh),
    ROUTING_TRANSFORMER: ("routing", routing_transformer_kmeans),
    PERFORMER_PYTORCH: ("performer", performer_pytorch_favor),
}
PEER_CLASSES = {
    REFORMER_PYTORCH: "LSHAttention",
    ROUTING_TRANSFORMER: "KmeansAttention",
    PERFORMER_PYTORCH: "FastAttention",
}
