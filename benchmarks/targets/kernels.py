"""The kernels and the model every target measures: batch 1, 4 heads, head_dim 64, fp32 on the
CPU, the kernel settings the targets name (KERNELS), built from one `variants.ModelConfig`
(d_model 256) as a model builds its layers' kernels (`ModelConfig.kernel`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from variants import ModelConfig, TransformerLM

BATCH, HEADS, HEAD_DIM = 1, 4, 64
CPU = torch.device("cpu")
# The kernel settings the targets name; everything else at its registry default.
KERNELS = {
    "full": {},
    "lsh": {"n_hashes": 4, "bucket_size": 64},
    "blockwise": {"block_size": 128, "look_backward": 1},
    "strided": {"stride": "auto"},
    "compressed": {},
    "linformer": {},
    # n_clusters = L / window at each length (see `kernel`): clusters x window = L, the rule of
    # the reference code's configurations, which routing-transformer's layout requires.
    "routing": {"window": 128},
    "performer": {},
    "linear": {},
    "longformer": {},  # presets at their published shapes; one seed for the random blocks
    "bigbird": {"seed": 0},
    "sparse_fixed": {},
    # blockwise with as many key blocks per query block as the preset's causal pattern:
    # longformer own + 2 back + the global token's block; bigbird own + 1 back + the global
    # block + 3 random blocks.
    "blockwise-4x128": {"variant": "blockwise", "block_size": 128, "look_backward": 3},
    "blockwise-6x64": {"variant": "blockwise", "block_size": 64, "look_backward": 5},
    # Trainable block selection and the delta rule, at their registry defaults (gated kernels
    # get sigmoid(N(0, 1)) gates, as `base.sample_gates`).
    "moba": {},
    "nsa": {},
    "deltanet": {},
}
ROUTING_WINDOW = KERNELS["routing"]["window"]


def model_config(
    name: str,
    length: int,
    depth: int = 1,
    block: str = "residual",
    switches: dict | None = None,
    d_model: int = HEADS * HEAD_DIM,
    **extra,
) -> ModelConfig:
    """The targets' model: d_model 256, 4 heads (head_dim 64), the kernel settings of KERNELS
    (`extra` on top), at most `length` tokens; causal, but Linformer, which cannot be.
    `switches`: further ModelConfig fields (the memory switches)."""
    options = kernel_options(name, length) | extra
    variant = options.pop("variant", name)
    return ModelConfig(
        **(switches or {}),
        vocab_size=256,
        d_model=d_model,
        n_heads=HEADS,
        depth=depth,
        max_seq_len=length,
        attention=variant,
        attention_options=options,
        block=block,
        causal=variant != "linformer",
    )


def kernel(name: str, length: int, **extra) -> torch.nn.Module:
    """The kernel of `name` as the targets' model (`model_config`) builds a layer's."""
    return model_config(name, length, **extra).kernel()


def kernel_options(name: str, length: int) -> dict:
    """KERNELS[name], with routing's n_clusters = length / window (one cluster at least)."""
    options = dict(KERNELS[name])
    if name == "routing":
        options["n_clusters"] = max(1, length // ROUTING_WINDOW)
    return options


def model(attention: str, length: int, depth: int = 1, block: str = "residual") -> TransformerLM:
    """The targets' model (`model_config`)."""
    return TransformerLM(model_config(attention, length, depth, block))


def training_step(net: TransformerLM, length: int) -> Callable[[], None]:
    """Forward and backward of the next-token loss on random tokens (no optimiser step)."""
    tokens = torch.randint(0, 256, (BATCH, length + 1))

    def step():
        net.zero_grad(set_to_none=True)
        logits = net(tokens[:, :-1])  # (B, L, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()

    return step
