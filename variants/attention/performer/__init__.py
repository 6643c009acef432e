"""Performer (`performer`); importing it registers the variant.

layer     `PerformerAttention`, the registry's entry (options, capabilities, decoding)
"""

from variants.attention.performer.layer import PerformerAttention

__all__ = ["PerformerAttention"]
