"""Native Sparse Attention (`nsa`), one module per role; importing it registers the variant.

layer     `NSAAttention`, the registry's entry (options, the compression MLPs, gates, decoding)
function  `CompressedBranch` and `WindowBranch`: two of its branches, forward and backward (the
          selected branch is `common.selected_blocks.SelectedBlocks`, shared with MoBA), and
          `GatedSum`, their gated sum
"""

from variants.attention.nsa.layer import NSAAttention

__all__ = ["NSAAttention"]
