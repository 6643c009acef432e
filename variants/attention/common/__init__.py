"""The pieces the attention variants share; no variant imports another variant's module.

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
selection        which key blocks a query selects (MoBA, NSA)
selected_blocks  `SelectedBlocks`: the attention over the selected blocks (MoBA, NSA)
buffers          work cut so that temporaries stay small; index dtypes (LSH, routing)

A helper moves here once two variants use it; its first owner imports it from here too.
"""
