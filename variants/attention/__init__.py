"""Attention kernels, one module per variant; importing this package registers them all.

The large ones are packages split by role, as flash-linear-attention splits a layer, its
algorithm and its autograd function: `combined`, `lsh`, `routing`, `moba` and `nsa` each hold a
`layer` module (the registry's entry: options, capabilities, decoding), a `function` module
(the autograd function) and the helpers of their algorithm beside them.

Imported in the order the registry lists them: the exact reference first, then fixed patterns,
their combinations (with the Longformer, BigBird and Sparse Transformer presets), learnable
patterns, low rank and kernel methods, as in Tay et al.'s survey.
"""
# ruff: noqa: I001, F401  (order is the registry's order; imported to register)

from variants.attention import full
from variants.attention import blockwise, strided, compressed
from variants.attention import combined
from variants.attention import lsh, routing
from variants.attention import linformer
from variants.attention import performer, linear
from variants.attention import moba, nsa, deltanet
