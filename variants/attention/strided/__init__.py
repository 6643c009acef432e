"""Strided attention (`strided`, the Sparse Transformer's); importing it registers the variant.

layer     `StridedAttention`, the registry's entry (options, capabilities, decoding)
function  `strided_parts`, the pattern's two parts, and `LocalAndColumns`: their attention,
          forward and backward (an autograd function)
"""

from variants.attention.strided.layer import StridedAttention

__all__ = ["StridedAttention"]
