"""Combinations of fixed patterns (`combined`) and its presets, one module per role; importing
it registers `combined`, then `longformer`, `bigbird` and `sparse_fixed`.

layer     `CombinedAttention`, the registry's entry (options, the pattern, decoding)
plan      `Plan`: the disjoint pieces a pattern runs as at one length
function  `CombinedPieces`: the pieces' forward and backward (an autograd function)
presets   Longformer, BigBird and Sparse Transformer "fixed" with their published shapes
"""

from variants.attention.combined import presets
from variants.attention.combined.layer import CombinedAttention

__all__ = ["CombinedAttention", "presets"]
