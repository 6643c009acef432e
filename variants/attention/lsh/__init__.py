"""Reformer's LSH attention (`lsh`), one module per role; importing it registers the variant.

layer           `LSHAttention`, the registry's entry (options, capabilities, decoding), its cache
hashing         the angular hash: one per round, or a pair of them above 128 buckets
function        `RoundsWindowAttention`: the rounds' forward and backward (an autograd function)
bucket_windows  one round's sorted layout, each chunk's window of keys and its score bias
masks           the window keys a query must not see (causal, padding, documents, pairs once)

How the work is cut so that its temporaries stay small is `variants.attention.common.buffers`.
"""

from variants.attention.lsh.layer import LSHAttention, LSHCache

__all__ = ["LSHAttention", "LSHCache"]
