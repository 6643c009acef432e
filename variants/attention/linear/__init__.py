"""Linear attention (`linear`); importing it registers the variant.

layer     `LinearAttention`, the registry's entry (options, capabilities, decoding)
"""

from variants.attention.linear.layer import LinearAttention

__all__ = ["LinearAttention"]
