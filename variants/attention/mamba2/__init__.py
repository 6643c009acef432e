"""Mamba-2's SSD as a sequence mixer in the attention slot (`mamba2`); importing it registers
the variant.

layer     `Mamba2Attention`, the registry's entry (options, capabilities, decoding); its layer's
          parts are `common.recurrent`'s
function  `chunked_ssd`: the SSD block decomposition (autograd runs through it)
"""

from variants.attention.mamba2.layer import Mamba2Attention

__all__ = ["Mamba2Attention"]
