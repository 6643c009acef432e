"""The kernels and the model every target measures: by default batch 1, 4 heads, head_dim 64,
fp32 on the CPU (`Shape`; the command's --batch, --heads, --head-dim, --dtype and --device set
another for one run, `measured_at`), every registered variant with the settings the targets
name (SETTINGS) and the blockwise comparisons (SAME_BLOCKS_KERNELS), built from one
`variants.ModelConfig` as a model builds its layers' kernels (`ModelConfig.kernel`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from variants import ModelConfig, TransformerLM, attention_names, attention_spec

BATCH, HEADS, HEAD_DIM = 1, 4, 64  # the default shape
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Shape:
    """What the targets measure at: q, k, v of (batch, heads, L, head_dim) in `dtype` on
    `device`; the model's d_model is heads x head_dim."""

    batch: int = BATCH
    heads: int = HEADS
    head_dim: int = HEAD_DIM
    dtype: torch.dtype = torch.float32
    device: torch.device = CPU

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def parameter_dtype(self) -> torch.dtype:
        """Kernels' and models' parameters: float32, or float64 for a float64 run. Half inputs
        meet float32 parameters as they are, as in the jobs' kernel-alone measurements; a
        model step runs under autocast (`training_step`)."""
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def randn(self, length: int, requires_grad: bool = False) -> torch.Tensor:
        """N(0, 1) of (batch, heads, length, head_dim) in this dtype on this device."""
        x = torch.randn(self.batch, self.heads, length, self.head_dim)
        return x.to(self.device, self.dtype).requires_grad_(requires_grad)


_shape = Shape()


def shape() -> Shape:
    """The shape of the run under way (`measured_at`), else the default."""
    return _shape


@contextmanager
def measured_at(new: Shape) -> Iterator[None]:
    """Within the block every target measures at `new` (the default again after it)."""
    global _shape
    before, _shape = _shape, new
    try:
        yield
    finally:
        _shape = before


# The kernel settings the targets name, by variant; a registered variant not listed here is
# measured at its registry defaults (so a new variant joins the table without an edit).
SETTINGS = {
    "lsh": {"n_hashes": 4, "bucket_size": 64},
    "blockwise": {"block_size": 128, "look_backward": 1},
    "strided": {"stride": "auto"},
    # n_clusters = L / window at each length (see `kernel_options`): clusters x window = L, the
    # rule of the reference code's configurations, which routing-transformer's layout requires.
    "routing": {"window": 128},
    "bigbird": {"seed": 0},  # one seed for the random blocks
}
# blockwise with as many key blocks per query block as a combined preset's causal pattern:
# longformer own + 2 back + the global token's block; bigbird own + 1 back + the global block
# + 3 random blocks.
SAME_BLOCKS_KERNELS = {
    "blockwise-4x128": {"variant": "blockwise", "block_size": 128, "look_backward": 3},
    "blockwise-6x64": {"variant": "blockwise", "block_size": 64, "look_backward": 5},
}
ROUTING_WINDOW = SETTINGS["routing"]["window"]


def kernel_settings() -> dict[str, dict]:
    """Every kernel the targets time, by name: each registered variant (registry order) with
    its SETTINGS (else its defaults; gated kernels get sigmoid(N(0, 1)) gates, as
    `base.sample_gates`), then SAME_BLOCKS_KERNELS."""
    return {name: dict(SETTINGS.get(name, {})) for name in attention_names()} | {
        name: dict(options) for name, options in SAME_BLOCKS_KERNELS.items()
    }


def model_config(
    name: str,
    length: int,
    depth: int = 1,
    block: str = "residual",
    switches: dict | None = None,
    d_model: int | None = None,
    **extra,
) -> ModelConfig:
    """The targets' model: `shape()`'s heads and d_model (heads x head_dim unless `d_model`),
    the kernel settings of `kernel_settings` (`extra` on top), at most `length` tokens; causal
    where the variant can be (Linformer cannot and runs unmasked). `switches`: further
    ModelConfig fields (the memory switches)."""
    options = kernel_options(name, length) | extra
    variant = options.pop("variant", name)
    return ModelConfig(
        **(switches or {}),
        vocab_size=256,
        d_model=shape().d_model if d_model is None else d_model,
        n_heads=shape().heads,
        depth=depth,
        max_seq_len=length,
        attention=variant,
        attention_options=options,
        block=block,
        causal=attention_spec(variant).causal_supported,
    )


def kernel(name: str, length: int, **extra) -> torch.nn.Module:
    """The kernel of `name` as the targets' model (`model_config`) builds a layer's, on
    `shape()`'s device."""
    built = model_config(name, length, **extra).kernel()
    return built.to(device=shape().device, dtype=shape().parameter_dtype)


def kernel_options(name: str, length: int) -> dict:
    """`name`'s settings, with routing's n_clusters = length / window (one cluster at least);
    `ValueError` naming the kernels known if `name` is none of them."""
    settings = kernel_settings()
    if name not in settings:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(settings)}")
    options = settings[name]
    if name == "routing":
        options["n_clusters"] = max(1, length // ROUTING_WINDOW)
    return options


def model(attention: str, length: int, depth: int = 1, block: str = "residual") -> TransformerLM:
    """The targets' model (`model_config`), on `shape()`'s device."""
    net = TransformerLM(model_config(attention, length, depth, block))
    return net.to(device=shape().device, dtype=shape().parameter_dtype)


def training_step(net: TransformerLM, length: int) -> Callable[[], None]:
    """Forward and backward of the next-token loss on random tokens (no optimiser step); in
    a half `shape().dtype`, under autocast to it."""
    device, dtype = shape().device, shape().dtype
    tokens = torch.randint(0, 256, (shape().batch, length + 1), device=device)
    half = dtype in (torch.float16, torch.bfloat16)

    def step():
        net.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=half):
            logits = net(tokens[:, :-1])  # (B, L, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()

    return step
