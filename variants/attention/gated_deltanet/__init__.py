"""Gated DeltaNet (`gated_deltanet`); importing it registers the variant.

layer     `GatedDeltaNetAttention`, the registry's entry (options, capabilities, decoding); its
          kernel is `common.delta_rule`'s with a decay, its layer's parts `common.recurrent`'s
"""

from variants.attention.gated_deltanet.layer import GatedDeltaNetAttention

__all__ = ["GatedDeltaNetAttention"]
