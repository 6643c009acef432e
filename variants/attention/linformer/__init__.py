"""Linformer (`linformer`); importing it registers the variant.

layer     `LinformerAttention`, the registry's entry (options, capabilities, decoding)
"""

from variants.attention.linformer.layer import LinformerAttention

__all__ = ["LinformerAttention"]
