"""The systems people know, as presets of `combined` with their published shapes
(docs/variants.md: "combined"). These are the presets' defaults; `conf/attention/<name>.yaml`
mirrors them and tests/variants/test_registry.py checks that the two agree."""

from variants.attention.combined.layer import CombinedAttention
from variants.registry import register_preset

register_preset(
    "longformer",
    CombinedAttention,
    "Longformer: a sliding window (blocks of 128, two each side) plus global tokens.",
    published_as={"lra": "Longformer"},
    parts=("local", "global"),
    block_size=128,
    look_backward=2,
    look_forward=2,
    n_global=1,
)
register_preset(
    "bigbird",
    CombinedAttention,
    "BigBird: a window of 3 blocks of 64, a global block and 3 random blocks per query block.",
    published_as={"lra": "BigBird"},
    parts=("local", "global", "random"),
    block_size=64,
    look_backward=1,
    look_forward=1,
    n_global=64,
    n_random=3,
)
register_preset(
    "sparse_fixed",
    CombinedAttention,
    "Sparse Transformer fixed: blocks of 128 plus each block's last 32 positions (summaries).",
    published_as={"lra": "Sparse Transformer"},
    parts=("local", "summary"),
    block_size=128,
    look_backward=0,
    look_forward=0,
    n_summary=32,
)
