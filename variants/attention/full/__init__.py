"""Exact softmax attention (`full`), the reference every other variant is measured against;
importing it registers the variant.

layer     `FullAttention`, the registry's entry (options, capabilities, decoding)
"""

from variants.attention.full.layer import FullAttention

__all__ = ["FullAttention"]
