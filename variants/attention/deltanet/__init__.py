"""DeltaNet (`deltanet`); importing it registers the variant.

layer     `DeltaNetAttention`, the registry's entry (options, capabilities, decoding); its
          kernel, the delta rule in the chunked WY / UT form, is `common.delta_rule`'s (shared
          with gated_deltanet), its layer's parts `common.recurrent`'s
"""

from variants.attention.deltanet.layer import DeltaNetAttention

__all__ = ["DeltaNetAttention"]
