"""Blockwise (local) attention (`blockwise`); importing it registers the variant.

layer     `BlockwiseAttention`, the registry's entry (options, capabilities, decoding)
"""

from variants.attention.blockwise.layer import BlockwiseAttention

__all__ = ["BlockwiseAttention"]
