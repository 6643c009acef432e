"""Compressed attention (`compressed`); importing it registers the variant.

layer     `CompressedAttention`, the registry's entry (options, capabilities, decoding)
function  the compressions (max, conv) and `PastBlocksAndOwnBlock`: the causal attention over
          the past blocks and the own block, forward and backward (an autograd function)
"""

from variants.attention.compressed.layer import CompressedAttention

__all__ = ["CompressedAttention"]
