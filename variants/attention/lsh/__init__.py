"""Reformer's LSH attention (`lsh`), one module per role; importing it registers the variant.

layer     `LSHAttention`, the registry's entry (options, capabilities, decoding), and its cache
hashing   the angular hash: one per round, or a pair of them above 128 buckets
function  `RoundsWindowAttention`: the rounds' forward and backward (an autograd function)
windows   one round's sorted layout, each chunk's window of keys and its score bias
masks     the window keys a query must not see (causal, padding, documents, pairs counted once)
buffers   how the work is cut so that its temporaries stay small (slices, pieces, one buffer)
"""

from variants.attention.lsh.layer import LSHAttention, LSHCache

__all__ = ["LSHAttention", "LSHCache"]
