"""DeltaNet (`deltanet`); importing it registers the variant.

layer     `DeltaNetAttention`, the registry's entry (options, capabilities, decoding)
function  `chunked_delta_rule`: the delta rule in the chunked WY / UT form (autograd runs
          through it)
"""

from variants.attention.deltanet.layer import DeltaNetAttention

__all__ = ["DeltaNetAttention"]
