"""MoBA (`moba`), one module per role; importing it registers the variant.

layer      `MoBAAttention`, the registry's entry (options, decoding)
selection  which key blocks each query attends to besides its own (no gradient)
function   `SelectedBlocks`: the attention over those blocks, forward and backward
"""

from variants.attention.moba.layer import MoBAAttention

__all__ = ["MoBAAttention"]
