"""Attention kernels, one package per variant; importing this package registers them all.

Every variant has one shape, as flash-linear-attention splits a layer from its kernel: a package
`<name>/` whose `layer` module is the registry's entry (the `Attention` subclass: options,
capabilities, pattern, decoding, FLOPs) and whose `function` module, where the variant has a
kernel of its own, holds it (the autograd function, or DeltaNet's chunked recurrence); the large
ones keep the helpers of their algorithm beside them (lsh: hashing, windows, masks; routing:
windows; combined: plan, presets). Variants whose attention is SDPA's or a shared kernel's
(full, blockwise, linformer, linear, performer, moba) are a layer alone.

What variants share lives in `common/` (its docstring lists it); no variant imports another
variant's module (tests/variants/attention/test_layout.py).

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
