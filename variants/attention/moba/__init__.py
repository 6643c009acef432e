"""MoBA (`moba`); importing it registers the variant.

layer      `MoBAAttention`, the registry's entry (options, decoding)

Its algorithm is shared with NSA's selected branch and lives in `variants.attention.common`:
`selection` (which key blocks each query attends to besides its own, no gradient) and
`selected_blocks` (`SelectedBlocks`: the attention over those blocks, forward and backward).
"""

from variants.attention.moba.layer import MoBAAttention

__all__ = ["MoBAAttention"]
