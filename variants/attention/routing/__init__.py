"""Routing attention (`routing`), one module per role; importing it registers the variant.

layer            `RoutingAttention`, the registry's entry (options, centroids, decoding)
cluster_windows  the sort by cluster, each query's run of keys, the chunks' windows, score bias
function         `ClusterWindowAttention`: the attention over those windows, forward and backward
"""

from variants.attention.routing.layer import RoutingAttention

__all__ = ["RoutingAttention"]
