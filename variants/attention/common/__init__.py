"""Pieces two or more variants share, imported from here by all; no variant imports another's.

base             `Attention`, the contract every variant fulfils, and the small helpers of it
cache            the decoding caches (keys and values, windows, prefixes, states, clusters)
flash            softmax attention with its logsumexp, and its backward: parts merged by LSE
flex             FlexAttention block masks from a pattern (`impl="flex"`)
kernelized       feature-map attention and its causal prefix sums (performer, linear)
recurrent        `RecurrentAttention`: a d x d state's layer (deltanet, gated_deltanet, mamba2)
delta_rule       the delta rule, chunked, with a decay (deltanet, gated_deltanet)
local            sliding windows of whole blocks (blockwise, strided, combined, MoBA)
masking          key padding masks, documents, grouped KV heads
columns          the column layout of a strided pattern (strided, combined)
pooling          block summaries: `block_mean` (compressed, MoBA, NSA)
selection        which key blocks a query selects, and `selected_blocks` attends them (MoBA, NSA)
buffers          work cut so that temporaries stay small; index dtypes (LSH, routing)
"""
