"""Generation with `TransformerLM`: the prompt through every layer's cache once, then one token
at a time (`TransformerLM.generate` calls `generate` here).

Only attention mixes positions; embeddings, blocks' feed-forwards, norms and the head are
position-wise. So a step runs the model's own modules on the new positions alone, with every
layer's kernel temporarily wrapped (`layers.CachedKernel`) so that the layer's q, k, v go to the
kernel's `prefill` (the prompt, empty cache) or `decode` (one new position) instead of its
forward. The sinusoidal positions are those of the tokens' places in the whole sequence and
the token shift (if on) takes the previous position's embedding, kept between steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from variants.attention.common.base import evaluating
from variants.layers import CachedKernel, kernels_swapped
from variants.model_config import OWNER


@contextmanager
def cached_kernels(model, batch_size: int, max_len: int) -> Iterator[list]:
    """Within the block every attention layer of `model` runs its kernel through a fresh cache
    of `max_len` positions (each layer its own kernel's: a hybrid stack's differ); yields the
    caches, in layer order. The kernels come back on leaving it, also on an error."""
    weight = model.head.weight
    layers = list(model._attention_layers())
    wrapped = [
        CachedKernel(
            layer.kernel,
            layer.init_cache(batch_size, max_len=max_len, device=weight.device, dtype=weight.dtype),
        )
        for layer in layers
    ]
    with kernels_swapped(layers, wrapped):
        yield [kernel.cache for kernel in wrapped]


def check_decodable(model, total: int | None = None) -> None:
    """`ValueError` unless `model` can decode `total` positions through its caches: sinusoidal
    positions (a step sees only its new positions: rotary would need the cache's offset) and
    `total` (unless None) within its `max_seq_len`. A kernel that cannot decode raises when its
    cache is made (`cached_kernels`)."""
    if model.config.positions != "sinusoidal":
        raise ValueError(
            f"{OWNER}: option 'positions'={model.config.positions!r} is not supported; "
            "generation runs with positions='sinusoidal'"
        )
    if total is not None and total > model.config.max_seq_len:
        raise ValueError(
            f"{OWNER}: prompt + max_new_tokens = {total} exceeds option "
            f"'max_seq_len'={model.config.max_seq_len}"
        )


class Positions:
    """Runs `model` on the next positions of a sequence whose earlier positions are in the
    layers' caches (inside `cached_kernels`, without autograd): `step(new)` takes the tokens
    (B, t) that follow and returns their logits (B, t, vocab_size). It keeps the offset (their
    sinusoidal positions are their places in the whole sequence) and the last position's
    embedding, which the token shift (if on) reads at the next step."""

    def __init__(self, model):
        self.model = model
        self.start = 0
        self.previous = None  # the last position's embedding, for the token shift

    def step(self, new: torch.Tensor) -> torch.Tensor:
        """new (B, t) int64 -> logits (B, t, vocab_size)."""
        from variants.model import sinusoidal_positions  # model imports this module's caller

        model, start = self.model, self.start
        x = model.embed(new)  # (B, t, d_model)
        x = x + sinusoidal_positions(start + new.shape[1], x.shape[-1], x.device, x.dtype)[start:]
        if model.shift is not None:
            before = x[:, :1] * 0 if self.previous is None else self.previous  # (B, 1, d_model)
            shifted = torch.cat([before, x[:, :-1]], dim=1)  # x_{i-1}
            self.previous = x[:, -1:]
            x = x + model.shift(shifted)
        self.start += new.shape[1]
        return model.head(model.norm(model.blocks(x)))  # (B, t, vocab_size)


def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
) -> torch.Tensor:
    """prompt (B, T) int64 -> (B, T + max_new_tokens): the prompt and the generated tokens.

    temperature 0 is greedy (argmax); above 0 tokens are sampled from softmax(logits / t)
    with a generator seeded with `seed` (the global RNG if None). Runs without autograd and in
    eval mode. `ValueError` if a layer's kernel cannot decode (e.g. Linformer), the model is
    not causal or uses rotary positions, or T + max_new_tokens exceeds the model's `max_seq_len`.
    """
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(
            f"{OWNER}: prompt must have shape (batch, seq_len >= 1), got {tuple(prompt.shape)}"
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(
            f"{OWNER}: option 'max_new_tokens' must be an int >= 0, got {max_new_tokens!r}"
        )
    if temperature < 0:
        raise ValueError(f"{OWNER}: option 'temperature' must be >= 0, got {temperature!r}")
    batch, length = prompt.shape
    total = length + max_new_tokens
    check_decodable(model, total)
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=prompt.device).manual_seed(seed)
    tokens = [prompt]
    with torch.no_grad(), evaluating(model), cached_kernels(model, batch, total):
        positions, new = Positions(model), prompt
        for _ in range(max_new_tokens):
            logits = positions.step(new)[:, -1]  # (B, vocab)
            new = pick(logits, temperature, generator)  # (B, 1)
            tokens.append(new)
    return torch.cat(tokens, dim=1)


def pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token from (B, vocab) logits: argmax at temperature 0, else a sample."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = F.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)
